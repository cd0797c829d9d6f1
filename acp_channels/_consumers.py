"""The WebSocket edge of `/acp`: one JSON-RPC frame per text message, thin over the host (docs/wire-contract.md §8).

A socket that drops without a clean close leaves its connection alive for
WEBSOCKET_RESUME_SECONDS; an upgrade naming the connection and the last message the client
received reattaches to it, on any worker (docs/resumable-streams.md). The consumer talks to the
connection through a `gateway.SocketAttachment`, wherever the host lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final
from urllib.parse import parse_qs

from autobahn.exception import PayloadExceededError
from channels.generic.websocket import AsyncWebsocketConsumer

from acp_channels import _cors as cors
from acp_channels import _daphne_compat as daphne_compat
from acp_channels import _metrics as metrics
from acp_channels import _protocol as protocol
from acp_channels import _tickets as tickets
from acp_channels import oauth
from acp_channels._attach import attach_request, open_attachment
from acp_channels._conf import acp_settings
from acp_channels._gateway import (
    AgentBusy,
    AgentClosed,
    AgentNotStarted,
    HostUnreachable,
    LayerUnavailable,
    QuotaExceeded,
    ReplayUnavailable,
    ServerFull,
    ShuttingDown,
    SocketAttachment,
    SocketEnd,
    StreamBusy,
    WorkerFailed,
    locate,
    open_connection,
)
from acp_channels._identity import Principal
from acp_channels._lifecycle import lifecycle
from acp_channels.auth import SUBPROTOCOL, Refused, RequestContext, authenticate
from acp_channels.errors import AcpError, NoSuchSession, TooManyAttachments

TRY_AGAIN_LATER = 1013  # WebSocket close code: the server, or the principal, is at its connection limit
INTERNAL_ERROR = 1011  # WebSocket close code: the agent could not be started, or sending failed
MESSAGE_TOO_BIG = 1009  # WebSocket close code: an agent message exceeds the socket's message limit
#: WebSocket close code: this socket no longer carries its connection, which lives on (this
#: worker shuts down, or the host forgot a socket that was silent too long): reattach.
REATTACH = 1012
#: WebSocket close code: another socket reattached to this connection.
TAKEN_OVER = 4409
TAKEN_OVER_REASON = "another socket resumed this connection"
#: WebSocket close code: the connection's credential expired; the connection lives for
#: WEBSOCKET_RESUME_SECONDS: reattach with a new token of the same principal
#: (docs/authentication.md, expiry). As 4000 + 401, the status its credential now gets.
CREDENTIAL_EXPIRED = 4401
CREDENTIAL_EXPIRED_REASON = "credential expired; reattach with a new token"
#: A refused reattach where the server cannot answer an upgrade with an HTTP status (no ASGI
#: denial-response extension): accepted, then closed with 4000 + the status, the text as reason.
REFUSAL_CLOSE_BASE = 4000
#: The client closed on purpose: a close frame with 1000, or without a code (daphne reports no
#: code; the official TypeScript client closes so). The connection ends now. Any other end of the
#: socket starts the grace period, uvicorn's 1005 too: it reports a lost connection as 1005 ("no
#: status"), the code it also gives a close frame without a code.
CLEAN_CLOSE_CODES: Final = frozenset((1000, None))
#: The ASGI extension for answering an upgrade with an HTTP response (daphne through
#: acp_channels._daphne_compat, uvicorn).
DENIAL_EXTENSION: Final = "websocket.http.response"

REATTACH_INCOMPLETE = (
    "a reattach names the connection (Acp-Connection-Id) and the last message received (Last-Event-ID)"
)
LAST_EVENT_ID_NOT_A_COUNT = "Last-Event-ID of a WebSocket is the number of messages received"
NOT_A_WEBSOCKET = "Acp-Connection-Id names a connection that has no WebSocket"
RECEIVED_OPTION_UNKNOWN = f"{protocol.RECEIVED_QUERY} is {protocol.RECEIVED_AS_MESSAGE!r} or absent"
SHUTTING_DOWN = "this server is shutting down; connect again"
#: Close reasons fit a close frame: 125 bytes minus the code.
MAX_CLOSE_REASON_BYTES: Final = 123

logger = logging.getLogger("acp_channels.consumers")


@dataclass(frozen=True, slots=True)
class Reattach:
    """What an upgrade that reattaches names (either may be missing: refused)."""

    connection_id: str | None
    last_event_id: str | None
    #: The connection id came from the query: a browser, which cannot read the 101's
    #: Acp-Received, so the count comes as the first message too.
    browser_form: bool = False
    #: `acp_received` from the query (any client may ask for the message), validated on use.
    received_option: str | None = None

    @property
    def wants_received_message(self) -> bool:
        return self.browser_form or self.received_option == protocol.RECEIVED_AS_MESSAGE


def reattach_request(context: RequestContext) -> Reattach | None:
    """The connection and last message an upgrade names, from its headers or (browsers, which
    cannot set headers on a WebSocket) its query; None for a plain new socket."""
    query = parse_qs(bytes(context.scope.get("query_string", b"")).decode("latin-1"))
    header_connection_id = context.header(protocol.CONNECTION_HEADER)
    connection_id = header_connection_id or _first(query, "acp_connection_id")
    last_event_id = context.header(protocol.LAST_EVENT_ID_HEADER) or _first(query, "last_event_id")
    if connection_id is None and last_event_id is None:
        return None
    browser_form = not header_connection_id and connection_id is not None
    return Reattach(connection_id, last_event_id, browser_form, _first(query, protocol.RECEIVED_QUERY))


def received_message(received: int) -> str:
    """The first text message on a reattached socket that asked for it: Acp-Received for a
    client that cannot read the 101. A notification outside the server's numbering."""
    notification = {"jsonrpc": protocol.JSONRPC_VERSION, "method": protocol.RECEIVED_NOTIFICATION}
    return protocol.dumps({**notification, "params": {"received": received}})


def attach_names(context: RequestContext) -> tuple[str | None, str | None, str | None]:
    """The session, role and cursor an upgrade attaches with: headers, or (browsers) the query."""
    query = parse_qs(bytes(context.scope.get("query_string", b"")).decode("latin-1"))
    session_id = context.header(protocol.ATTACH_SESSION_HEADER) or _first(query, protocol.ATTACH_SESSION_QUERY)
    role = context.header(protocol.ATTACH_ROLE_HEADER) or _first(query, protocol.ATTACH_ROLE_QUERY)
    cursor = context.header(protocol.ATTACH_CURSOR_HEADER) or _first(query, protocol.ATTACH_CURSOR_QUERY)
    return session_id, role, cursor


def _first(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0].strip() if values else None


class AcpWebsocketConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]
    # No channel of its own on the layer: the host reaches the socket directly, and an unused
    # layer receive (a Redis read timing out) would end the consumer and cut the socket.
    channel_layer_alias = None
    socket: SocketAttachment | None = None
    connection_id: str | None = None
    writer: asyncio.Task[None] | None = None

    async def dispatch(self, message: dict[str, Any]) -> None:
        """channels closes stale database connections before every handler, through
        `sync_to_async` (a thread hop) for each message: most of what a frame cost beyond our
        own work (bench/PROFILE.md). A frame only goes to the agent, which does its own database
        calls through `database_sync_to_async` (that closes stale connections itself): frames
        skip it. The upgrade (authentication may query users) and the disconnect keep it."""
        if message["type"] == "websocket.receive":
            await self.websocket_receive(message)
        else:
            await super().dispatch(message)

    async def connect(self) -> None:
        daphne_compat.install()  # for a router not built by build_asgi_application (_patches.py, "When")
        if cors.refusal(cors.websocket_request(self.scope)) is not None:
            await self.close()  # before accept: the server answers 403
            return
        context = RequestContext.for_websocket(self.scope)
        reattach = reattach_request(context)
        if lifecycle.draining and reattach is not None:
            # The connection lives on another worker, or ends with this one: try again.
            await self.refuse(503, SHUTTING_DOWN)
            return
        try:
            # Once, at the upgrade: every frame on the socket is this principal's.
            principal = await self.authenticate(context)
        except Refused as refused:
            # Before accept: daphne answers 403 (it cannot send a 401 or a challenge there).
            logger.info("refused a WebSocket upgrade from %s: %s", context.remote_address or "-", refused)
            await self.close()
            return
        # The subprotocol is "acp" when offered, never the token-carrying one.
        subprotocol = SUBPROTOCOL if SUBPROTOCOL in context.subprotocols else None
        if reattach is not None:
            await self.reattach(reattach, principal, subprotocol)
            return
        try:
            attach = attach_request(*attach_names(context))
        except ValueError as error:
            await self.refuse(400, str(error), subprotocol)
            return
        try:
            if attach is None:
                connection = await open_connection("websocket", principal, context.remote_address)
            else:  # another client of a live session (docs/shared-sessions.md)
                connection = await open_attachment("websocket", principal, context.remote_address, attach)
        except (NoSuchSession, TooManyAttachments, ReplayUnavailable) as refused:
            await self.refuse_with(refused, subprotocol)
            return
        except ShuttingDown as refused:
            logger.info("refused a WebSocket from %s: %s", context.remote_address or "-", refused)
            await self.close()  # before accept: 403
            return
        except (ServerFull, QuotaExceeded, AgentNotStarted) as refused:  # the caps (1013), or our fault (1011)
            if not isinstance(refused, AgentNotStarted):  # logged where it happened, at ERROR
                # One INFO line, as django.request logs the same refusal over HTTP (acp_channels._logs).
                logger.info(
                    "refused a WebSocket from %s: %s (closed with %d)",
                    context.remote_address or "-",
                    refused,
                    refused.close_code,
                )
            await self.accept(subprotocol)
            await self.close(code=refused.close_code)
            return
        except (LayerUnavailable, WorkerFailed) as error:  # placing it on a runner failed
            logger.warning("could not open a WebSocket's connection: %s", error)
            await self.refuse_with(error, subprotocol)
            return
        try:
            socket = await connection.attach_first_socket()
        except (ReplayUnavailable, HostUnreachable, LayerUnavailable, AgentBusy, WorkerFailed, AgentClosed) as error:
            # The runner it was placed on went away, or the layer did, before the socket attached.
            await connection.abandon()
            refusal = HostUnreachable(connection.connection_id) if isinstance(error, AgentClosed) else error
            await self.refuse_with(refusal, subprotocol)
            return
        await self.attach(socket, connection.connection_id, subprotocol, [])

    @staticmethod
    async def authenticate(context: RequestContext) -> Principal:
        """A ticket's principal (the acp-ticket.<ticket> subprotocol: taken once, from the Origin
        it was issued for; an OAuth token's scopes checked for this upgrade), else the
        authenticator's. Raises Refused."""
        ticket = tickets.offered_ticket(context.subprotocols)
        if ticket is None:
            return await authenticate(context)
        taken = await tickets.take(ticket, context.header("origin"))
        if taken is None:
            raise Refused.unauthenticated(tickets.TICKET_REFUSED)
        if taken.scopes is not None:
            oauth.refuse_unless_granted(context, taken.scopes)
        return taken.principal

    async def reattach(self, request: Reattach, principal: Principal, subprotocol: str | None) -> None:
        """A new socket for a connection whose socket dropped (or is about to be replaced):
        refused before the upgrade when it cannot resume, else its 101 says how many client
        messages the server has, and the agent's messages after the client's last follow."""
        connection_id, last = request.connection_id, request.last_event_id
        if connection_id is None or last is None:
            await self.refuse(400, REATTACH_INCOMPLETE, subprotocol)
            return
        if not last.isdigit() or len(last) > 18:
            await self.refuse(400, LAST_EVENT_ID_NOT_A_COUNT, subprotocol)
            return
        if request.received_option not in (None, protocol.RECEIVED_AS_MESSAGE):
            await self.refuse(400, RECEIVED_OPTION_UNKNOWN, subprotocol)
            return
        handle = locate(connection_id, principal)
        try:
            if handle is None:  # unknown, or another principal's: the same answer
                raise HostUnreachable(connection_id)
            socket = await handle.attach_socket(int(last))
        except StreamBusy:
            await self.refuse(409, NOT_A_WEBSOCKET, subprotocol)
            return
        except AgentClosed:  # ended (its grace period is over): as unknown
            await self.refuse_with(HostUnreachable(connection_id), subprotocol)
            return
        except (ReplayUnavailable, HostUnreachable, LayerUnavailable, AgentBusy, WorkerFailed) as error:
            if isinstance(error, WorkerFailed):
                logger.error("connection %s: %s", connection_id, error)
            elif isinstance(error, LayerUnavailable):
                logger.warning("channel layer unavailable: %s", error)
            await self.refuse_with(error, subprotocol)
            return
        logger.info(
            "connection %s: socket reattached after message %s (client messages received: %d)",
            connection_id,
            last,
            socket.received,
        )
        received_header = (protocol.RECEIVED_HEADER.encode(), str(socket.received).encode())
        first = received_message(socket.received) if request.wants_received_message else None
        await self.attach(socket, connection_id, subprotocol, [received_header], first)

    async def attach(
        self,
        socket: SocketAttachment,
        connection_id: str,
        subprotocol: str | None,
        headers: list[tuple[bytes, bytes]],
        first_message: str | None = None,
    ) -> None:
        """Accept (the connection id on the 101, under daphne through acp_channels._daphne_compat)
        and start writing the agent's messages, after `first_message` when there is one (sent
        here, outside the host's numbering: it is never replayed nor counted)."""
        self.socket = socket
        metrics.record_stream_opened("websocket")  # closed in disconnect(), which sees self.socket
        self.connection_id = connection_id
        connection_header = (protocol.CONNECTION_HEADER.encode(), connection_id.encode())
        await self.accept(subprotocol, headers=[connection_header, *headers])
        if first_message is not None:
            # Before the writer starts, so it is the first text message on the socket. A client
            # gone meanwhile (uvicorn raises): disconnect() follows and detaches.
            try:
                await self.send(text_data=first_message)
            except OSError:
                return
        self.writer = asyncio.create_task(self.write_outbound(socket, connection_id))

    async def refuse_with(self, error: AcpError, subprotocol: str | None = None) -> None:
        """Refuse an upgrade as the error tree says (acp_channels/errors.py): its status and text."""
        await self.refuse(error.status, error.text, subprotocol)

    async def refuse(self, status: int, text: str, subprotocol: str | None = None) -> None:
        """Answer the upgrade with an HTTP status and a text/plain body; where the server cannot
        (no denial-response extension), accept and close at once with 4000 + status."""
        body = text.encode()
        if DENIAL_EXTENSION in (self.scope.get("extensions") or {}):
            headers = [(b"content-length", str(len(body)).encode())]
            if body:
                headers.append((b"content-type", b"text/plain; charset=utf-8"))
            await self.base_send({"type": "websocket.http.response.start", "status": status, "headers": headers})
            await self.base_send({"type": "websocket.http.response.body", "body": body})
            return
        reason = (text or HTTPStatus(status).phrase).encode()[:MAX_CLOSE_REASON_BYTES].decode("utf-8", "ignore")
        await self.accept(subprotocol)
        await self.close(code=REFUSAL_CLOSE_BASE + status, reason=reason)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data is None or self.socket is None:
            return  # binary messages are ignored, as in the reference
        try:
            await self.socket.send_to_agent(text_data)
        except AgentClosed:
            pass  # the connection ended: its socket closes once what is queued is sent
        except (HostUnreachable, LayerUnavailable) as error:
            logger.warning("connection %s: the host is unreachable (%s); closing the socket", self.connection_id, error)
            with contextlib.suppress(OSError):
                await self.close(code=INTERNAL_ERROR, reason="the connection's host is unreachable")
        except WorkerFailed as error:
            logger.error("connection %s: %s; closing the socket", self.connection_id, error)
            with contextlib.suppress(OSError):
                await self.close(code=INTERNAL_ERROR, reason=f"the connection's worker failed to handle {error.op}")
        except AgentBusy as error:  # the host has the message; its agent is slow to take it
            logger.warning("connection %s: %s", self.connection_id, error)

    async def write_outbound(self, socket: SocketAttachment, connection_id: str) -> None:
        """Send the agent's frames in order; once the connection ends, drain and close (or
        close as the socket's end says: another socket took over, reattach).

        A failure to send ends the connection with a close code the client can read (1009 for a
        message over the server's limit, 1011 otherwise) and a log line, never silently.
        """
        item = ""
        # The ASGI send itself: what `self.send(text_data=...)` does, two coroutines fewer per
        # message (bench/profiles/ours-daphne-stream-ws.txt).
        send = self.base_send
        try:
            while (items := await socket.take(None)) is not None:
                for item in items:
                    await send({"type": "websocket.send", "text": item})
            await self.close_for(socket.end_reason)
        except PayloadExceededError as error:
            # daphne (autobahn) refuses a message over --websocket-max-message-size before
            # writing any of it, so the socket can still carry a close frame. uvicorn has no
            # outgoing limit.
            reason = too_big_reason(len(item.encode()), error)
            logger.warning("connection %s: %s; closing the socket", connection_id, reason)
            await self.end_after_failure(socket, MESSAGE_TOO_BIG, reason)
        except OSError:
            # uvicorn's ClientDisconnected: the client left; disconnect() follows.
            logger.debug("connection %s: the client left while a message was sent", connection_id)
        except Exception:
            logger.exception("connection %s: sending to the socket failed; closing it", connection_id)
            await self.end_after_failure(socket, INTERNAL_ERROR, "the server failed to send an agent message")

    async def close_for(self, end: SocketEnd) -> None:
        if end == "ended":
            await self.close()
        elif end == "taken":
            await self.close(code=TAKEN_OVER, reason=TAKEN_OVER_REASON)
        elif end == "expired":
            await self.close(code=CREDENTIAL_EXPIRED, reason=CREDENTIAL_EXPIRED_REASON)
        elif end == "gone":
            await self.close(code=INTERNAL_ERROR, reason="the connection's host is unreachable")
        else:  # lost, draining: the connection lives on
            await self.close(code=REATTACH, reason="reattach to resume this connection")

    async def end_after_failure(self, socket: SocketAttachment, code: int, reason: str) -> None:
        """Tell the client why (the close frame first, so it learns at once), then end the agent."""
        with contextlib.suppress(OSError):  # the client may have left meanwhile (uvicorn)
            await self.close(code=code, reason=reason)
        await socket.detach("send failed")

    async def disconnect(self, code: Any) -> None:
        if self.writer is not None:
            self.writer.cancel()
        if self.socket is not None:
            metrics.record_stream_closed("websocket")
            clean = code in CLEAN_CLOSE_CODES or not acp_settings.WEBSOCKET_RESUME_SECONDS
            await self.socket.detach("socket closed" if clean else None)


#: autobahn's wording: "... exceeding payload limit of 16781312 octets".
_AUTOBAHN_LIMIT = re.compile(r"limit of (\d+)")


def too_big_reason(size: int, error: Exception) -> str:
    """The close reason for an agent message over the socket's limit (fits a close frame)."""
    limit = _AUTOBAHN_LIMIT.search(str(error))
    if limit is None:
        return f"agent message of {size} bytes exceeds the socket's limit"
    return f"agent message of {size} bytes exceeds the socket's limit of {limit.group(1)}"
