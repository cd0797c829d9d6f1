"""ACP over one WebSocket: one text message per frame each way (a batch is one message).

As in the reference client (docs/wire-contract.md §13, WebSocket mode): no ACP headers, no
initialize gate (the agent decides), binary messages ignored. The 101's `acp-connection-id` is
kept as `connection_id` (our server and the official SDK servers send it), and custom headers
and cookies go on the upgrade request. Credentials travel in the `Authorization` header of the
upgrade, or, as a browser must send them, in the offered subprotocols
(`subprotocols=["acp", "acp.bearer.<token>"]`).

Unlike the reference, a socket that breaks is reattached when the server advertised it
(`initialize`'s `result._meta["acp-channels/resume"].websocket`) and its first 101 named the
connection (docs/resumable-streams.md): a new upgrade with `Acp-Connection-Id` and
`Last-Event-ID: <text messages received>`, whose 101 says in `Acp-Received` how many of ours
the server got; the ones after that are sent again, in order, before anything new. To do that
the last `RESEND_WINDOW_MESSAGES` messages sent (at most `RESEND_WINDOW_BYTES`, but always the
last one) are kept; a server that got fewer than that window covers makes the reattach fatal
(`ResumeFailedError`), as does a 404 or 409 to it (unless `restart` handles the 404). A close
frame from the server is its decision and stays fatal; only a socket that ends without one, or
with 1001 (going away) or 1012 (service restart), is reattached.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import httpx
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from acp_channels import _protocol as protocol

from ._base import FrameValue, cancel_and_wait, frame_value_for_send, received
from ._errors import (
    NetworkError,
    ProtocolViolationError,
    ReconnectGaveUpError,
    ResumeFailedError,
    ResumeRefusedError,
    TransportError,
    WebSocketClosedError,
)
from ._reconnect import ReconnectCallback, ReconnectEvent, ReconnectPolicy, StreamDrop, gone_detail
from ._resend_window import ResendWindow
from ._tls import tls_context
from ._token_source import BearerCredentials
from ._ws_upgrade import UpgradeRefused, WebSocketUpgrade

__all__ = ["RESEND_WINDOW_BYTES", "RESEND_WINDOW_MESSAGES", "WebSocketTransport"]

logger = logging.getLogger("acp_channels.client")

#: Sent messages kept for a reattach to send again (the oldest go first; the last one is always kept).
RESEND_WINDOW_MESSAGES: Final = 4096
RESEND_WINDOW_BYTES: Final = 16 * 1024 * 1024
LAST_EVENT_ID: Final = "Last-Event-ID"
RECEIVED_HEADER: Final = "Acp-Received"
#: Close codes a proxy or a restarting worker sends while the connection lives on.
_RESUMABLE_CLOSE_CODES: Final = frozenset({1001, 1012})
#: Close codes of a server that ends a socket because its credential expired, the connection
#: living on for a socket with a new token (docs/authentication.md).
EXPIRED_CLOSE_CODES: Final = frozenset({4401})
#: Upgrade statuses worth another try (a busy or restarting server or balancer).
_RETRY_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})
WHAT: Final = "WebSocket"
#: The close code of a client that goes without ending its connection (a browser tab closing).
GOING_AWAY: Final = 1001


class WebSocketTransport(WebSocketUpgrade):
    """One WebSocket. Use it through `HttpClient`. Its layers: the upgrade (ws_upgrade),
    reconnecting and restarting (reconnect); here, sending, reading and reattaching."""

    kind: Final = "ws"

    def __init__(
        self,
        endpoint: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = 30.0,
        cookies: httpx.Cookies | dict[str, str] | None = None,
        max_message_size: int = 64 * 1024 * 1024,
        ping_interval: float | None = 20.0,
        subprotocols: Sequence[str] = (),
        secrets: Iterable[str] = (),
        reconnect: ReconnectPolicy | None = None,
        restart: bool = False,
        on_reconnect: ReconnectCallback | None = None,
        verify: ssl.SSLContext | str | bool = True,
        attach: Mapping[str, str] | None = None,
        credentials: BearerCredentials | None = None,
    ) -> None:
        super().__init__(
            endpoint,
            headers,
            timeout,
            max_message_size,
            secrets=secrets,
            reconnect=reconnect,
            restart=restart,
            on_reconnect=on_reconnect,
            attach=attach,
            credentials=credentials,
        )
        self._ssl = tls_context(verify) if endpoint.startswith("wss:") and verify is not True else None
        self._ping_interval = ping_interval
        self._subprotocols = [Subprotocol(name) for name in subprotocols]
        self.subprotocol = None
        self.cookies = httpx.Cookies(cookies)
        self._socket: ClientConnection | None = None
        self._connect_lock = asyncio.Lock()
        self._send_lock = asyncio.Lock()
        self._attached = asyncio.Event()  # a socket is up and every retained message was resent
        self._reader: asyncio.Task[None] | None = None
        self._reattach_task: asyncio.Task[None] | None = None
        #: The first 101 named the connection: a reattach can name it too.
        self._named = False
        self._received_count = 0
        self._sent = ResendWindow(RESEND_WINDOW_MESSAGES, RESEND_WINDOW_BYTES)
        self._restarting = False

    @property
    def received_count(self) -> int:
        """Text messages received on this connection (what a reattach sends as `Last-Event-ID`)."""
        return self._received_count

    @property
    def sent_count(self) -> int:
        return self._sent.sent_count

    # --------------------------------------------------------------------------- the socket

    async def connect(self) -> None:
        """Open the socket (done by the first send when not called)."""
        self._raise_if_unusable()
        async with self._connect_lock:
            if self._socket is not None or self._attached.is_set() or self._reattach_task is not None:
                return
            self._raise_if_unusable()
            try:
                socket = await self._open(self._attach_headers)
            except UpgradeRefused as refused:
                raise self._fail(refused.error) from refused
            except TransportError as exc:
                raise self._fail(exc) from exc
            self._named = self.connection_id is not None
            self._attach(socket)

    def _attach(self, socket: ClientConnection) -> None:
        self._socket = socket
        self._reader = asyncio.create_task(self._read(socket), name="acp-client websocket reader")
        self._attached.set()

    # ------------------------------------------------------------------------------ sending

    async def send(self, frame: Any, *, raw: str | None = None) -> None:
        value = frame_value_for_send(frame)
        self._raise_if_unusable()
        await self.connect()
        text = raw if raw is not None else protocol.dumps(value)
        while True:
            await self._unless_failed(self._attached.wait(), self._closing)
            async with self._send_lock:
                socket = self._socket
                if not self._attached.is_set() or socket is None:
                    continue  # it dropped while we waited for the lock
                if self._ledger.stale_answer(value):
                    logger.info("dropped an answer to a request of the connection that was lost")
                    return
                self._ledger.sent(value)
                await self._send_numbered(socket, text)
            if self.error is not None:
                raise self.error
            if logger.isEnabledFor(logging.DEBUG):
                what = value.get("method", "response") if isinstance(value, dict) else "batch"
                logger.debug("sent %s", what)
            return

    async def _send_numbered(self, socket: ClientConnection, text: str) -> None:
        """Number and keep `text` (a reattach may send it again), then send it. A socket that
        drops meanwhile is handled as a drop: the message goes again after a reattach."""
        self._sent.keep(text)
        try:
            await self._unless_failed(socket.send(text), self._closing)
        except ConnectionClosed as exc:
            self._dropped(socket, exc)

    # ---------------------------------------------------------------------------- receiving

    async def _read(self, socket: ClientConnection) -> None:
        try:
            while True:
                message = await socket.recv()
                if isinstance(message, str):
                    self._received_count += 1
                    self._take(*received(message))
                # Binary messages carry nothing in ACP: ignored, as the reference does.
        except ConnectionClosed as exc:
            if not self._close_started:
                self._dropped(socket, exc)

    def _take(self, value: FrameValue, exact: str | None) -> None:
        if self._intercepted(value):
            return
        self._ledger.received(value)
        if self._ledger.attach_failure is not None:
            self._fail(ProtocolViolationError(self._ledger.attach_failure))
            return
        self._inbox.put(value, exact)

    # ---------------------------------------------------------------------------- reattach

    def _dropped(self, socket: ClientConnection, exc: ConnectionClosed) -> None:
        """`socket` ended: reattach when that can lose nothing, else fail."""
        if socket is not self._socket or self.closed:
            return  # an old socket, or already handled
        self._attached.clear()
        self._socket = None
        error = self._closed_by_peer(exc)
        # The server closes a socket whose credential expired; with a token source that can
        # refresh, the connection is reattached with a new token.
        expired = exc.rcvd is not None and exc.rcvd.code in EXPIRED_CLOSE_CODES and self._refreshable
        resumable = exc.rcvd is None or exc.rcvd.code in _RESUMABLE_CLOSE_CODES or expired
        if (
            not resumable
            or self._ledger.terminated  # the attached session's connection ended: nothing to resume
            or self._reconnect is None
            or self._restarting
            or not self._named
            or not self._ledger.resume.websocket
        ):
            self._fail(error)
            return
        self._reattach_task = asyncio.create_task(
            self._reattach(error, expired_token=self.socket_token if expired else None),
            name="acp-client websocket reattach",
        )

    @property
    def _refreshable(self) -> bool:
        return self._credentials is not None and self._credentials.refreshable

    async def _reattach(self, error: TransportError, *, expired_token: str | None = None) -> None:
        """Reattach until the policy gives up. `expired_token`: the socket was closed because
        its token expired: a new one first (the refresh ahead of time may have brought it)."""
        assert self._reconnect is not None
        loop = asyncio.get_running_loop()
        dropped_at = loop.time()
        attempt = 0
        # One new token per outage: a reattach refused with the new one too is refused.
        renewed = expired_token is not None
        try:
            if expired_token is not None and not await self._token_renewed(expired_token):
                self._give_up(WHAT, error)
                return
            while not self.closed:
                attempt += 1
                elapsed = loop.time() - dropped_at
                drop = StreamDrop(None, attempt, error, str(self._received_count), elapsed, WHAT)
                delay = self._policy_delay(drop)
                if delay is None:
                    gave_up = error if attempt == 1 else ReconnectGaveUpError(WHAT, attempt - 1, elapsed, error)
                    self._give_up(WHAT, gave_up)
                    return
                if delay > 0:
                    await asyncio.sleep(delay)
                try:
                    if await self._reattach_once():
                        self._tell(ReconnectEvent("resumed", WHAT))
                        return
                    error = NetworkError("WebSocket reattach: the new socket closed during the resend")
                except UpgradeRefused as refused:
                    error = refused.error
                    if refused.by_close and error.status_code == 401 and not renewed and self._refreshable:
                        # Refused by a close after the upgrade (no challenge there; an HTTP 401
                        # was retried by _open): once more with a new token.
                        renewed = True
                        if self._offered_token is not None and await self._token_renewed(self._offered_token):
                            continue
                    if error.status_code == 404 and self._restart:
                        await self._restart_connection()
                        return
                    if error.status_code in (404, 409):
                        detail = gone_detail(self.connection_id, "restart is off") if error.status_code == 404 else ""
                        refused_error = ResumeRefusedError(error.request, error.status_code, error.body, detail=detail)
                        self._give_up(WHAT, refused_error)
                        return
                    if error.status_code not in _RETRY_STATUSES:
                        self._give_up(WHAT, error)
                        return
                except TransportError as exc:
                    if isinstance(exc, ResumeFailedError | ProtocolViolationError):
                        self._give_up(WHAT, exc)
                        return
                    error = exc
        finally:
            self._reattach_task = None

    async def _reattach_once(self) -> bool:
        """One reattach: the upgrade, then the resend. False when the new socket dropped again."""
        assert self.connection_id is not None
        headers = {"Acp-Connection-Id": self.connection_id, LAST_EVENT_ID: str(self._received_count)}
        socket = await self._open(headers, "WebSocket reattach")
        response = socket.response
        header = response.headers.get(RECEIVED_HEADER) if response is not None else None
        if header is None or not header.strip().isdigit():
            await self._refused_after_upgrade(socket)
            raise ProtocolViolationError(f"WebSocket reattach: the 101 has no valid {RECEIVED_HEADER} ({header!r})")
        got = int(header)
        async with self._send_lock:
            try:
                resend = self._sent.after(got)
            except TransportError:
                await socket.close()
                raise
            try:
                for text in resend:
                    await self._unless_failed(socket.send(text), self._closing)
            except ConnectionClosed:
                return False
            self._attach(socket)
        logger.debug("WebSocket reattached: %d received, %d of ours sent again", got, self._sent.sent_count - got)
        return True

    async def _token_renewed(self, expired: str) -> bool:
        """The token source replaced `expired` (now, or already ahead of time)."""
        assert self._credentials is not None
        try:
            return await self._unless_failed(self._credentials.replaced(expired), self._closing)
        except TransportError as exc:
            logger.info("%s", exc)
            return False

    # ----------------------------------------------------------------------------- restart

    async def _restart_connection(self) -> None:
        """A new connection in place of the one the server forgot (see `_restart_in_place`)."""
        previous = self.connection_id
        refusal = self._ledger.restart_refusal()
        if refusal is not None:
            detail = gone_detail(self.connection_id, refusal)
            self._give_up(WHAT, ResumeRefusedError("WebSocket reattach", 404, detail=detail))
            return
        self._restarting = True
        try:
            async with self._send_lock:
                event = await self._restart_in_place(WHAT, previous)
                self._attached.set()
            self._tell(event)
        except TransportError as exc:
            self._give_up(WHAT, exc)
        finally:
            self._restarting = False

    async def _connect_again(self) -> None:
        """A plain upgrade, then `initialize` with the caller's params."""
        self._received_count = 0
        self._sent.clear()
        try:
            socket = await self._open({})
        except UpgradeRefused as refused:
            raise refused.error from refused
        self._socket = socket
        self._reader = asyncio.create_task(self._read(socket), name="acp-client websocket reader")
        reply = await self._private_call(self._ledger.initialize_request())
        if "error" in reply:
            raise ResumeFailedError(f"restart: the new connection's initialize failed: {reply['error']}")
        self._ledger.initialize_id = None
        self._ledger.received(reply)

    async def _send_private(self, message: protocol.Message) -> dict[str, Any] | None:
        """Send a restart's own request on the new socket (its reply arrives as a message)."""
        if self._socket is None:  # it dropped during the restart: the transport failed
            raise self._closed_error()
        await self._send_numbered(self._socket, protocol.dumps(message))
        return None

    # ------------------------------------------------------------------------------ the end

    @staticmethod
    def _closed_by_peer(exc: ConnectionClosed) -> WebSocketClosedError:
        if exc.rcvd is None:
            return WebSocketClosedError(None, "the connection ended without a close frame")
        code = exc.rcvd.code
        return WebSocketClosedError(None if code == 1005 else code, exc.rcvd.reason)

    def _fail(self, error: TransportError) -> TransportError:
        if self._record_failure(error, logger):
            self._attached.clear()
            self._inbox.end(error)
        return error

    async def _shut_down(self) -> None:
        """Send a Close frame (code 1000: the server ends the connection, or detaches an
        attachment; 1001 after `detach()`: the server keeps it) and stop reading."""
        await cancel_and_wait([self._reattach_task])
        if self._socket is not None:
            with contextlib.suppress(Exception):
                await self._socket.close(code=GOING_AWAY if self._leave_on_server else 1000)
        await cancel_and_wait([self._reader])
        self._inbox.end(None)
