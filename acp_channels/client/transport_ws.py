"""ACP over one WebSocket: one text message per frame each way (a batch is one message).

As in the reference client (rust-reference §13, WebSocket mode): no ACP headers, no
initialize gate (the agent decides), binary messages ignored, and any close or break of the
socket by the server is fatal. The 101's `acp-connection-id` is kept as `connection_id`
(our server and the official SDK servers send it), and custom headers and cookies go on the
upgrade request. Credentials travel in the `Authorization` header of the upgrade, or, as a
browser must send them, in the offered subprotocols (`subprotocols=["acp", "acp.bearer.<token>"]`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.typing import Subprotocol

from acp_channels import protocol
from acp_channels.protocol import CONNECTION_HEADER

from ._base import TransportBase, frame_value_for_send, received
from .errors import (
    NetworkError,
    TransportClosedError,
    TransportError,
    TransportTimeoutError,
    WebSocketClosedError,
)

__all__ = ["WebSocketTransport"]

logger = logging.getLogger("acp_channels.client")

T = TypeVar("T")


class WebSocketTransport(TransportBase):
    """One WebSocket. Use it through `HttpClient`."""

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
    ) -> None:
        super().__init__(endpoint, headers, timeout, max_message_size, secrets=secrets)
        self._ping_interval = ping_interval
        self._subprotocols = [Subprotocol(name) for name in subprotocols]
        #: The subprotocol the server chose (None: it chose none).
        self.subprotocol: str | None = None
        self.cookies = httpx.Cookies(cookies)
        self._socket: ClientConnection | None = None
        self._connect_lock = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None
        self._close_done = asyncio.Event()

    async def connect(self) -> None:
        """Open the socket (done by the first send when not called)."""
        self._raise_if_unusable()
        async with self._connect_lock:
            if self._socket is not None:
                return
            self._raise_if_unusable()
            headers = dict(self._headers)
            cookie_header = "; ".join(f"{name}={value}" for name, value in self.cookies.items())
            if cookie_header and not any(name.lower() == "cookie" for name in headers):
                headers["Cookie"] = cookie_header
            try:
                socket = await connect(
                    self.endpoint,
                    additional_headers=headers,
                    user_agent_header="acp-channels-client",
                    open_timeout=self._timeout,
                    close_timeout=self._timeout,
                    max_size=self._max_message_size,
                    ping_interval=self._ping_interval,
                    subprotocols=self._subprotocols or None,
                )
            except InvalidStatus as exc:
                body = exc.response.body.decode(errors="replace") if exc.response.body else ""
                challenge = exc.response.headers.get("WWW-Authenticate")
                refused = self._status_error("WebSocket upgrade", exc.response.status_code, body[:2000], challenge)
                raise self._fail(refused) from exc
            except TimeoutError as exc:
                error = TransportTimeoutError(f"WebSocket upgrade: no answer within {self._timeout}s")
                raise self._fail(error) from exc
            except (OSError, InvalidHandshake, InvalidURI) as exc:
                failed = NetworkError(self.redact(f"WebSocket upgrade: {type(exc).__name__}: {exc}"))
                raise self._fail(failed) from exc
            self.subprotocol = socket.subprotocol
            response = socket.response
            if response is not None:
                self.connection_id = protocol.header_value(response.headers.get_all(CONNECTION_HEADER)) or None
                set_cookies = response.headers.get_all("Set-Cookie")
                if set_cookies:
                    http_url = "http" + self.endpoint.removeprefix("ws")
                    fake = httpx.Response(
                        101,
                        headers=[("set-cookie", value) for value in set_cookies],
                        request=httpx.Request("GET", http_url),
                    )
                    self.cookies.extract_cookies(fake)
            self._socket = socket
            self._reader = asyncio.create_task(self._read(socket), name="acp-client websocket reader")

    async def send(self, frame: Any, *, raw: str | None = None) -> None:
        value = frame_value_for_send(frame)
        self._raise_if_unusable()
        await self.connect()
        socket = self._socket
        assert socket is not None
        try:
            await self._unless_failed(socket.send(raw if raw is not None else protocol.dumps(value)))
            if logger.isEnabledFor(logging.DEBUG):
                what = value.get("method", "response") if isinstance(value, dict) else "batch"
                logger.debug("sent %s", what)
        except ConnectionClosed as exc:
            raise self._fail(self._closed_by_peer(exc)) from exc

    async def _read(self, socket: ClientConnection) -> None:
        try:
            while True:
                message = await socket.recv()
                if isinstance(message, str):
                    self._inbox.put(*received(message))
                # Binary messages carry nothing in ACP: ignored, as the reference does.
        except ConnectionClosed as exc:
            if not self._close_started:
                self._fail(self._closed_by_peer(exc))

    @staticmethod
    def _closed_by_peer(exc: ConnectionClosed) -> WebSocketClosedError:
        if exc.rcvd is None:
            return WebSocketClosedError(None, "the connection ended without a close frame")
        code = exc.rcvd.code
        return WebSocketClosedError(None if code == 1005 else code, exc.rcvd.reason)

    def _raise_if_unusable(self) -> None:
        if self.error is not None:
            raise self._closed_error()
        if self._close_started:
            raise TransportClosedError("transport is closed")

    def _fail(self, error: TransportError) -> TransportError:
        if self._record_failure(error, logger):
            self._inbox.end(error)
        return error

    async def close(self) -> None:
        """Send a Close frame and stop reading."""
        if self._close_started:
            await self._close_done.wait()
            return
        self._close_started = True
        try:
            if self._socket is not None:
                with contextlib.suppress(Exception):
                    await self._socket.close()
            if self._reader is not None:
                self._reader.cancel()
                with contextlib.suppress(BaseException):
                    await self._reader
            self._inbox.end(None)
        finally:
            self._close_done.set()
