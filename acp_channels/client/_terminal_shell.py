"""The terminal client's command loop (see terminal): the link prompts go to, the commands
(`/help`, `/info`, `/sessions`, `/new`, `/load`, `/attach`, `/detach`, `/quit`), the turns
(one's own, and one that was running when it attached, followed to its end), and what a lost
link means: when the server no longer has it (it restarted, or the session was terminated), one
line saying so and what can be done next, instead of going on with a dead id."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import acp
from acp.schema import AvailableCommand
from rich.text import Text

from ._directory import sessions_table
from ._errors import AcpClientError, TransportError
from ._http_client import HttpClient
from ._shared_sessions import OBSERVER_REFUSED, AttachRole
from ._terminal_client import TerminalClient, Turn
from ._terminal_input import CANCELLED, INTERRUPTED, Input, LineReader, PlainInput, line_or_cancelled
from ._terminal_link import Link, Linker, connection_gone
from ._terminal_output import Screen, describe_error, describe_request_error, elapsed

__all__ = [
    "COMMANDS",
    "EXIT_CONNECTION_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_TURN_NOT_DONE",
    "GREETING",
    "LinkLost",
    "Shell",
    "show_help",
]

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
    (("/load [ID]",), "load a session (session/load; by default the one that was lost)"),
    (("/attach ID",), "leave this session (it goes on) and attach to the live session ID"),
    (("/detach",), "leave without ending the session and exit; it says how to come back"),
    (("/quit", "/exit", "/q"), "close the connection and exit (Ctrl-D too); an attachment only detaches"),
)
KEYS: tuple[tuple[str, str], ...] = (
    ("Enter", "send the prompt"),
    ("Up / Down", "earlier prompts (Ctrl-R searches them)"),
    ("Ctrl-C", "cancel the running turn; at the prompt, twice to exit"),
    ("Ctrl-D", "exit"),
)
QUIT_COMMANDS = frozenset(next(names for names, _ in COMMANDS if "/quit" in names))
GREETING = "Type a prompt and press Enter, or /help. Ctrl-C cancels a running turn; /quit or Ctrl-D exits."

T = TypeVar("T")


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


class LinkLost(Exception):
    """The link prompts go to failed (its transport's error, or the SDK's)."""

    def __init__(self, link: Link, error: BaseException) -> None:
        super().__init__(str(error))
        self.link = link
        self.error = error


class Shell:
    """The command loop: the link prompts go to, the commands, the turns, and what a lost link means."""

    def __init__(
        self,
        screen: Screen,
        lines: Input,
        reader: LineReader | None,
        client: TerminalClient,
        linker: Linker,
        *,
        role: AttachRole,
        close_timeout: float,
    ) -> None:
        self.screen = screen
        self.lines = lines
        self.reader = reader
        self.client = client
        self.linker = linker
        self.role: AttachRole = role
        self.close_timeout = close_timeout
        self.link: Link | None = None
        #: The last link the server no longer had: what /load brings back.
        self.lost: Link | None = None
        #: The link's connection was restarted without its session (prompts would go nowhere).
        self.session_gone = False
        self.connected = False
        self.detached = False
        self.pending: set[asyncio.Task[Any]] = set()
        #: A connection being opened (Ctrl-C twice stops it).
        self.opening: asyncio.Future[Link] | None = None
        self.commands: dict[str, Callable[[str], Awaitable[bool]]] = {
            "/help": self.help,
            "/info": self.info,
            "/sessions": self.sessions,
            "/new": self.new,
            "/load": self.load,
            "/attach": self.attach,
            "/detach": self.detach,
        }
        linker.on_sessions_lost = self.sessions_lost

    # ------------------------------------------------------------------------------ Ctrl-C

    def cancel_turn(self) -> None:
        if (link := self.link) is not None:
            task = asyncio.ensure_future(link.conn.cancel(session_id=link.session_id))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)

    def quit_now(self) -> None:
        self.client.quit_requested = True
        if self.reader is not None:
            self.reader.push_eof()
        if self.client.turn is not None:
            self.client.turn.task.cancel()
        elif self.opening is not None:
            self.opening.cancel()

    # ------------------------------------------------------------------------ the session

    async def run(self, first: Coroutine[Any, Any, Link], prompt: str | None) -> int:
        """Open the first link, then one prompt (`prompt`) or the command loop; the exit status."""
        self.linker.greeting = GREETING
        link = self.link = await self._open(first)
        self.connected = True
        if prompt is not None:
            try:
                if link.running_turn_end is not None and await self.follow(link) is None:
                    return EXIT_CONNECTION_FAILED  # quit before its turn
                await self.read("> ")  # the input holds the prompt alone: shown as a transcript shows it
                reason = await self.turn(prompt)
            except LinkLost as lost:
                raise lost.error from None
            return {"end_turn": 0, "error": EXIT_CONNECTION_FAILED}.get(reason or "error", EXIT_TURN_NOT_DONE)
        try:
            if link.running_turn_end is not None:
                await self.follow(link)
        except LinkLost as lost:
            await self.lose(lost)
        while not self.client.quit_requested:
            try:
                if not await self.step():
                    break
            except LinkLost as lost:
                await self.lose(lost)
        return EXIT_CONNECTION_FAILED if self.link is None and self.lost is not None else 0

    async def step(self) -> bool:
        """Read a line and do it; False: the session is over."""
        line = await self.read("> ")
        if line is None:
            if not isinstance(self.lines, PlainInput) or self.lines.interactive:
                self.screen.line()  # Ctrl-D leaves the cursor after the prompt
            return False
        if line is INTERRUPTED:
            self.client.interrupt(self.cancel_turn, self.quit_now)
            return True
        self.client.quit_armed = False
        text = str(line).strip()
        if not text:
            return True
        if text in QUIT_COMMANDS:
            return False
        command, _, argument = text.partition(" ")
        if (run_command := self.commands.get(command)) is not None:
            return await run_command(argument.strip())
        if self.link is None:
            self.screen.error("not connected: " + self.linker.offer(self._lost_session(), self._load_session()))
            return True
        if self.session_gone:
            offer = self.linker.offer(self.link.session_id, self.link.transport.load_session)
            self.screen.error(f"session {self.link.session_id} is gone: {offer}")
            return True
        return await self.turn(text) is not None

    async def read(self, prompt: str) -> str | object | None:
        """A line, or what `Input.read` says instead; raises `LinkLost` when the link fails meanwhile."""
        link = self.link
        failed = link.transport.wait_failed() if link is not None else asyncio.Event().wait()
        line: str | object | None = await line_or_cancelled(self.lines.read(prompt), failed)
        if line is CANCELLED:
            self.screen.line()  # leave the prompt's line
            assert link is not None
            raise self._failure(link)
        return line

    async def turn(self, text: str) -> str | None:
        """One prompt: its stop reason, "error", or None when the user quit meanwhile."""
        link = self.link
        assert link is not None
        screen, client = self.screen, self.client
        screen.start_turn()
        turn = Turn(asyncio.ensure_future(link.conn.prompt(session_id=link.session_id, prompt=[acp.text_block(text)])))
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
        except ConnectionError as exc:
            raise self._failure(link, exc) from exc
        finally:
            client.turn = None
            took = screen.end_turn()
        if outcome is None:
            screen.line("[quit]", style="yellow")
            return None
        if isinstance(outcome, acp.RequestError):
            screen.error(describe_request_error(outcome))
            if outcome.code == OBSERVER_REFUSED:
                screen.hint("Attached as an observer: it watches the session and cannot prompt.")
            return "error"
        return self._ended(str(outcome.stop_reason), took)

    def _ended(self, reason: str, took: float) -> str:
        style = "dim" if reason == "end_turn" else "yellow"
        self.screen.line(Text.assemble((f"[{reason}]", style), (f" {elapsed(took)}", "dim")))
        return reason

    async def follow(self, link: Link) -> str | None:
        """Follow the turn running when `link` attached to its end: its stop reason (None: quit)."""
        waiter = link.running_turn_end
        assert waiter is not None
        link.running_turn_end = None
        self.screen.start_turn("following")
        task = asyncio.ensure_future(self._turn_end(link, waiter))
        self.client.turn = Turn(task)  # Ctrl-C cancels it, as one's own
        try:
            reason = await task
        except asyncio.CancelledError:
            if not self.client.quit_requested:
                raise
            reason = None
        finally:
            self.client.turn = None
            took = self.screen.end_turn()
        if reason is None:
            self.screen.line("[quit]", style="yellow")
            return None
        return self._ended(reason, took)

    async def _turn_end(self, link: Link, waiter: asyncio.Future[str]) -> str:
        while True:
            reason = await self._unless_lost(link, waiter)
            # What the session retained may hold an earlier turn's end: the directory says
            # whether a turn still runs (the next end is awaited from now, not to miss it).
            waiter = self.client.expect_turn_end(link.session_id)
            if not await self._still_running(link):
                self.client.forget_turn_end(link.session_id)
                return reason

    @staticmethod
    async def _still_running(link: Link) -> bool:
        try:
            directory = await link.transport.list_sessions()
        except AcpClientError:
            return False
        return any(entry.session_id == link.session_id and entry.turn_running for entry in directory.sessions)

    async def _unless_lost(self, link: Link, waiter: asyncio.Future[T]) -> T:
        failed = asyncio.ensure_future(link.transport.wait_failed())
        waits: set[asyncio.Future[Any]] = {waiter, failed}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
        if waiter.done():
            return waiter.result()
        raise self._failure(link)

    # --------------------------------------------------------------------------- commands

    async def help(self, _: str) -> bool:
        show_help(self.screen, self.client.agent_commands)
        return True

    async def info(self, _: str) -> bool:
        if (link := self.link) is None:
            self.screen.line("not connected: " + self.linker.offer(self._lost_session(), self._load_session()))
        else:
            self.screen.line(f"{link.agent_name} over {link.shape} at {link.transport.url}")
            self.screen.line(link.info())
        return True

    async def sessions(self, _: str) -> bool:
        link = self.link or self.lost
        assert link is not None
        try:
            self.screen.line(sessions_table(await link.transport.list_sessions()))
        except AcpClientError as exc:
            self.screen.error(str(exc))
        return True

    async def new(self, _: str) -> bool:
        link = self.link
        if link is None or link.attachment is not None:
            await self.switch(self.linker.new_session())  # an attachment carries its session only
            return True
        try:
            link.session_id = (await link.conn.new_session(cwd=self.linker.cwd, mcp_servers=[])).session_id
        except acp.RequestError as exc:
            self.screen.error(describe_request_error(exc))
            return True
        except ConnectionError as exc:
            raise self._failure(link, exc) from exc
        self.session_gone = False
        self.screen.line(link.info(), style="dim")
        return True

    async def load(self, argument: str) -> bool:
        session_id = argument or self._lost_session()
        if not session_id:
            self.screen.error("/load needs a session id (/sessions lists yours)")
            return True
        link = self.link
        if link is None or link.attachment is not None:
            await self.switch(self.linker.load(session_id))
            return True
        if not link.transport.load_session:
            self.screen.error("the agent does not support session/load (it does not advertise loadSession)")
            return True
        try:
            await link.conn.load_session(cwd=self.linker.cwd, session_id=session_id, mcp_servers=[])
        except acp.RequestError as exc:
            self.screen.error(describe_request_error(exc))
            return True
        except ConnectionError as exc:
            raise self._failure(link, exc) from exc
        link.session_id = session_id
        self.session_gone = False
        self.screen.line(link.info(), style="dim")
        return True

    async def attach(self, argument: str) -> bool:
        if not argument:
            self.screen.error("/attach needs a session id (/sessions lists yours)")
        else:
            await self.switch(self.linker.attach(argument, self.role))
        return True

    async def detach(self, _: str) -> bool:
        if (link := self.link) is None:
            self.screen.error("not connected")
            return True
        self.link = None
        await link.detach(self.close_timeout)
        self.detached = True
        self.screen.line(f"Detached: session {link.session_id} goes on on the server.")
        self.screen.line(f"To come back: {self.linker.come_back(link.session_id)}")
        return False

    async def switch(self, opening: Coroutine[Any, Any, Link]) -> None:
        """Open a new link and make it the one prompts go to; the one before is left (its
        session goes on, and how to come back is said). A refusal keeps the one before."""
        try:
            new = await self._open(opening)
        except asyncio.CancelledError:
            if not self.client.quit_requested:
                raise
            return
        except acp.RequestError as exc:
            self.screen.error(describe_request_error(exc))
            return
        except (AcpClientError, ConnectionError) as exc:
            self.screen.error(describe_error(exc, self.linker.endpoint))
            return
        old, self.link, self.lost, self.session_gone = self.link, new, None, False
        if old is not None:
            await old.detach(self.close_timeout)
            come_back = self.linker.come_back(old.session_id)
            self.screen.line(f"Left session {old.session_id} (it goes on): {come_back}", style="dim")
        if new.running_turn_end is not None:
            await self.follow(new)

    # ----------------------------------------------------------------------- lost links

    def _failure(self, link: Link, exc: BaseException | None = None) -> LinkLost:
        return LinkLost(link, link.transport.error or exc or TransportError("connection lost"))

    async def lose(self, lost: LinkLost) -> None:
        """A link failed: when the server no longer has it (it restarted, or the session was
        terminated), say so in one line with what can be done next; any other failure ends the
        program (raised)."""
        link = lost.link
        terminated = link.attachment is not None and link.session_id in self.client.terminated
        if not terminated and not connection_gone(lost.error):
            raise lost.error
        self.screen.error(self.linker.lost(link, terminated))
        self.screen.hint(self.linker.offer(link.session_id, link.transport.load_session))
        self.lost = link
        if self.link is link:
            self.link = None
        await link.close(self.close_timeout)

    def sessions_lost(self, transport: HttpClient, lost: tuple[tuple[str, str], ...]) -> None:
        """A restart (`--restart`) could not load sessions: when the one prompts go to is among
        them, say so in one line, with what can be done next."""
        link = self.link
        why = dict(lost).get(link.session_id) if link is not None and link.transport is transport else None
        if link is None or why is None:
            return
        self.session_gone = True
        self.screen.error(self.linker.session_gone(link.session_id, why))
        self.screen.hint(self.linker.offer(link.session_id, transport.load_session))

    def _lost_session(self) -> str | None:
        return self.lost.session_id if self.lost is not None else None

    def _load_session(self) -> bool:
        return self.lost is not None and self.lost.transport.load_session

    async def _open(self, opening: Coroutine[Any, Any, Link]) -> Link:
        self.opening = asyncio.ensure_future(opening)
        try:
            return await self.opening
        finally:
            self.opening = None

    async def close(self) -> None:
        """Close the link (an attachment: that detaches it, and how to come back is said)."""
        for task in self.pending:
            task.cancel()
        if (link := self.link) is not None:
            await link.close(self.close_timeout)
            if link.attachment is not None:
                come_back = self.linker.come_back(link.session_id)
                self.screen.line(f"Session {link.session_id} goes on on the server: {come_back}", style="dim")
        if self.connected and not self.detached:
            self.screen.line("Disconnected.", style="dim")
