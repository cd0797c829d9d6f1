"""The terminal client's connections to the server (docs/client.md, docs/shared-sessions.md):
opening one (a new session, an attachment to a live session, a session loaded into a new
connection), what the user is told about it, and what a lost one means: one line saying what
happened, and what can be done next."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import acp
from acp.client.connection import ClientSideConnection
from acp.connection import StreamEvent, StreamObserver
from acp.interfaces import Client
from acp.schema import ClientCapabilities, FileSystemCapabilities, Implementation, InitializeResponse
from rich.text import Text

from acp_channels import __version__

from ._errors import HttpStatusError, WebSocketClosedError
from ._http_client import HttpClient, resolve_endpoint, shown_url
from ._reconnect import ReconnectEvent, ReconnectPolicy
from ._shared_sessions import Attachment, AttachRole
from ._terminal_client import TerminalClient
from ._terminal_output import ReconnectNotices, Screen
from ._token_source import TokenSource

__all__ = ["Link", "Linker", "connection_gone"]


def connection_gone(error: BaseException | None) -> bool:
    """The server no longer has the connection (it restarted, or the connection was ended): a
    404 to a request or a resume, or a socket the server closed as done (1000: one that is going
    away or restarting closes with 1001 or 1012, and is reattached)."""
    if isinstance(error, HttpStatusError):
        return error.status_code == 404
    return isinstance(error, WebSocketClosedError) and error.code == 1000


def link_info(transport: HttpClient, session_id: str) -> str:
    """`connection C  session S`, and what an attachment is attached to."""
    text = f"connection {transport.connection_id or '-'}  session {session_id}"
    attachment = transport.attachment
    if attachment is not None:
        text += f"  attached to connection {attachment.connection_id} as {attachment.role}"
    return text


@dataclass
class Link:
    """One connection to the server, and the session the prompts go to."""

    transport: HttpClient
    conn: ClientSideConnection
    session_id: str
    agent_name: str
    #: The stop reason of the turn running when it attached (set before any message is read).
    running_turn_end: asyncio.Future[str] | None = None

    @property
    def attachment(self) -> Attachment | None:
        return self.transport.attachment

    @property
    def shape(self) -> str:
        return "HTTP+SSE" if self.transport.kind == "http" else "WebSocket"

    def info(self) -> str:
        return link_info(self.transport, self.session_id)

    async def close(self, timeout: float) -> None:
        """Close the connection (an attachment: that detaches it), within `timeout` seconds."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.conn.close(), timeout)

    async def detach(self, timeout: float) -> None:
        """Go without ending the session (the server keeps it for a client to attach)."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.transport.detach(), timeout)
        await self.close(timeout)


class Linker:
    """Opens links the way the command line asked: its URL, credentials, timeouts, reconnecting."""

    def __init__(
        self,
        url: str,
        *,
        client: TerminalClient,
        screen: Screen,
        cwd: str,
        headers: Mapping[str, str] | None,
        token: str | TokenSource | None,
        token_subprotocol: bool,
        timeout: float | None,
        reconnect: ReconnectPolicy | None,
        restart: bool,
        fs: bool,
    ) -> None:
        self.url = url
        #: The endpoint the URL names, and the transport its scheme selects.
        self.endpoint, self.kind = resolve_endpoint(url)
        self.client = client
        self.screen = screen
        self.cwd = cwd
        self.headers = headers
        self.token = token
        self.token_subprotocol = token_subprotocol
        self.timeout = timeout
        self.reconnect = reconnect
        self.restart = restart
        self.fs = fs
        #: Said once, under the first link's greeting.
        self.greeting: str | None = None
        #: Told when a restart (`--restart`) could not load sessions: the transport, and
        #: (session, why) for each.
        self.on_sessions_lost: Callable[[HttpClient, tuple[tuple[str, str], ...]], None] | None = None

    @property
    def credentials(self) -> bool:
        """A token or an Authorization header is sent (an anonymous client cannot attach)."""
        return self.token is not None or any(name.lower() == "authorization" for name in self.headers or {})

    def transport(self, attach: str | None = None, role: AttachRole = "controller") -> HttpClient:
        notices = ReconnectNotices(self.screen)

        def told(event: ReconnectEvent) -> None:
            notices(event)
            if event.kind == "restarted" and event.sessions_lost and self.on_sessions_lost is not None:
                self.on_sessions_lost(transport, event.sessions_lost)

        transport = HttpClient(
            self.url,
            headers=self.headers,
            token=self.token,
            websocket_token="subprotocol" if self.token_subprotocol else "header",
            timeout=self.timeout,
            reconnect=self.reconnect,
            restart=self.restart and attach is None,  # an attachment is attached again, never restarted
            on_reconnect=told,
            attach=attach,
            role=role,
        )
        notices.transport = transport
        return transport

    async def _connect(
        self, transport: HttpClient, *observers: StreamObserver
    ) -> tuple[ClientSideConnection, InitializeResponse]:
        # Observers see each message before it is handled: the ids of permission requests.
        observing = [self.client.observe, *observers]
        conn = acp.connect_to_agent(cast(Client, self.client), transport, observers=observing)
        try:
            init = await conn.initialize(
                protocol_version=acp.PROTOCOL_VERSION,
                client_capabilities=ClientCapabilities(
                    fs=FileSystemCapabilities(read_text_file=self.fs, write_text_file=self.fs)
                ),
                client_info=Implementation(
                    name="acp-channels-terminal", title="acp-channels terminal", version=__version__
                ),
            )
        except BaseException:
            await self._close(conn)
            if transport.error is not None:
                raise transport.error from None  # what went wrong, not the SDK's "connection closed"
            raise
        return conn, init

    @staticmethod
    def _agent_name(init: InitializeResponse) -> str:
        agent = init.agent_info
        return f"{agent.title or agent.name} {agent.version}" if agent else "the agent"

    @staticmethod
    def _agent_name_in(result: Any) -> str:
        agent = result.get("agentInfo") if isinstance(result, dict) else None
        if not isinstance(agent, dict):
            return "the agent"
        return f"{agent.get('title') or agent.get('name')} {agent.get('version')}"

    async def _close(self, conn: ClientSideConnection) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), (self.timeout or 30.0) + 5)

    async def new_session(self) -> Link:
        """A new connection with a new session."""
        transport = self.transport()
        conn, init = await self._connect(transport)
        try:
            session_id = (await conn.new_session(cwd=self.cwd, mcp_servers=[])).session_id
        except BaseException:
            await self._close(conn)
            raise
        link = Link(transport, conn, session_id, self._agent_name(init))
        self._greet(link.agent_name, transport, session_id)
        return link

    async def load(self, session_id: str) -> Link:
        """A new connection into which `session_id` is loaded (`session/load`: the agent replays it)."""
        transport = self.transport()
        conn, init = await self._connect(transport)
        self._greet(self._agent_name(init), transport, session_id)  # before the history it replays
        try:
            await conn.load_session(cwd=self.cwd, session_id=session_id, mcp_servers=[])
        except BaseException:
            await self._close(conn)
            raise
        return Link(transport, conn, session_id, self._agent_name(init))

    async def attach(self, session_id: str, role: AttachRole) -> Link:
        """An attachment to the live session `session_id`."""
        transport = self.transport(session_id, role)
        # Before initialize: the end of a running turn may come right behind its answer.
        running_turn_end: asyncio.Future[str] | None = self.client.expect_turn_end(session_id)
        greeted: list[bool] = []

        def greet(event: StreamEvent) -> None:
            # On the initialize answer, before what the session retained (right behind it) is handled.
            attachment = transport.attachment
            if attachment is not None and not greeted and "result" in event.message:
                greeted.append(True)
                self._greet(self._agent_name_in(event.message["result"]), transport, attachment.session_id)

        try:
            conn, init = await self._connect(transport, greet)
        except BaseException:
            self.client.forget_turn_end(session_id)
            raise
        attachment = transport.attachment
        assert attachment is not None  # else the transport failed (the server did not attach)
        if not attachment.turn_running:
            self.client.forget_turn_end(session_id)
            running_turn_end = None
        return Link(transport, conn, attachment.session_id, self._agent_name(init), running_turn_end)

    # ------------------------------------------------------------------------------ telling

    def _greet(self, agent_name: str, transport: HttpClient, session_id: str) -> None:
        attachment = transport.attachment
        where = f" over {'HTTP+SSE' if transport.kind == 'http' else 'WebSocket'} at {transport.url}"
        if attachment is None:
            self.screen.line(Text.assemble("Connected to ", (agent_name, "bold"), where))
        else:
            what = f"session {attachment.session_id}" + (" (observer)" if attachment.role == "observer" else "")
            self.screen.line(Text.assemble("Attached to ", (what, "bold"), " of ", (agent_name, "bold"), where))
        self.screen.line(link_info(transport, session_id), style="dim")
        if self.greeting is not None:
            self.screen.line(self.greeting, style="dim")
            self.greeting = None
        if attachment is not None and attachment.turn_running:
            self.screen.line("A turn is running: what the session retained, then the turn to its end.", style="dim")

    def come_back(self, session_id: str) -> str:
        """The command line that attaches to `session_id` again."""
        line = f"acp-client {shown_url(self.url)} --attach {session_id}"
        return line if self.credentials else line + " (with a token: an anonymous client cannot attach)"

    def lost(self, link: Link, terminated: bool) -> str:
        """What happened to a link the server no longer has, in one line."""
        if terminated:
            return f"session {link.session_id} was ended on the server (its connection was terminated)"
        return (
            f"the server no longer has connection {link.transport.connection_id} (it restarted, or the "
            f"connection was ended): session {link.session_id} is gone"
        )

    @staticmethod
    def session_gone(session_id: str, why: str) -> str:
        """A restarted connection could not load the session prompts went to, in one line."""
        return f"session {session_id} is gone: the connection was restarted and the agent could not load it ({why})"

    @staticmethod
    def offer(lost_session: str | None, load_session: bool) -> str:
        """What can be done after a link was lost."""
        load = f", /load loads session {lost_session} again (the agent supports session/load)"
        return "/new starts a new session" + (load if lost_session and load_session else "") + ", /quit exits"
