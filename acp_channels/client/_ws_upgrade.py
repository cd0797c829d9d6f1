"""The WebSocket transport's upgrade request and what its answer says: the headers, cookies,
subprotocols and TLS of the request; from the 101, the connection id, the chosen subprotocol and
the cookies set; any other status as an `UpgradeRefused`."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Mapping
from typing import Any, Final

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.typing import Subprotocol

from acp_channels import _protocol as protocol
from acp_channels._protocol import CONNECTION_HEADER

from ._errors import AuthenticationError, HttpStatusError, NetworkError, TransportTimeoutError
from ._reconnect import ReconnectingTransport

logger = logging.getLogger("acp_channels.client")

__all__ = ["REFUSAL_CLOSE_BASE", "UpgradeRefused", "WebSocketUpgrade"]

#: A server that cannot answer an upgrade with an HTTP status refuses a reattach by closing the
#: accepted socket with this + the status (docs/resumable-streams.md).
REFUSAL_CLOSE_BASE: Final = 4000


class UpgradeRefused(Exception):
    """An upgrade answered with a status instead of 101."""

    def __init__(self, error: HttpStatusError, *, by_close: bool = False) -> None:
        self.error = error
        #: Told by a close after the upgrade (4000 + the status), not by an HTTP answer.
        self.by_close = by_close


class WebSocketUpgrade(ReconnectingTransport):
    """Opening the socket (WebSocketTransport sets the attributes below)."""

    #: wss:// only: the TLS context checking the server (None: websockets' default).
    _ssl: ssl.SSLContext | None
    _ping_interval: float | None
    _subprotocols: list[Subprotocol]
    #: The subprotocol the server chose (None: it chose none).
    subprotocol: str | None
    cookies: httpx.Cookies
    #: The bearer token of the last upgrade sent, and of the last one accepted (None: no
    #: credentials of ours): the one a close for expiry refuses.
    _offered_token: str | None = None
    socket_token: str | None = None

    async def _open(self, extra_headers: Mapping[str, str], what: str = "WebSocket upgrade") -> ClientConnection:
        """A new socket, with the current token; raises `UpgradeRefused` for a non-101 status, a
        `TransportError` otherwise. An upgrade refused with 401 `error="invalid_token"` is made
        once more when the token source has a new token. Records the connection id and cookies
        of the 101, and the token the socket was opened with (`socket_token`)."""
        try:
            return await self._open_once(extra_headers, what)
        except UpgradeRefused as refused:
            error = refused.error
            challenge = error.www_authenticate if isinstance(error, AuthenticationError) else None
            if not await self._token_replaced(error.status_code, challenge, self._offered_token):
                raise
            logger.info("%s: HTTP 401 invalid_token; upgrading again with the refreshed token", what)
        return await self._open_once(extra_headers, what)

    async def _open_once(self, extra_headers: Mapping[str, str], what: str) -> ClientConnection:
        headers, self._offered_token = await self._authorized({**self._headers, **extra_headers})
        cookie_header = "; ".join(f"{name}={value}" for name, value in self.cookies.items())
        if cookie_header and not any(name.lower() == "cookie" for name in headers):
            headers["Cookie"] = cookie_header
        tls_option: dict[str, Any] = {} if self._ssl is None else {"ssl": self._ssl}
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
                **tls_option,
            )
        except InvalidStatus as exc:
            body = exc.response.body.decode(errors="replace") if exc.response.body else ""
            challenge = exc.response.headers.get("WWW-Authenticate")
            raise UpgradeRefused(self._status_error(what, exc.response.status_code, body[:2000], challenge)) from exc
        except TimeoutError as exc:
            raise TransportTimeoutError(f"{what}: no answer within {self._timeout}s") from exc
        except (OSError, InvalidHandshake, InvalidURI) as exc:
            raise NetworkError(self.redact(f"{what}: {type(exc).__name__}: {exc}")) from exc
        self.subprotocol = socket.subprotocol
        self.socket_token = self._offered_token
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
        return socket

    async def _refused_after_upgrade(self, socket: ClientConnection) -> None:
        """A server that cannot refuse an upgrade with a status accepts it and closes with
        4000 + the status (the text as reason): raise that as `UpgradeRefused`. Else close the socket."""
        try:
            async with asyncio.timeout(self._timeout):
                await socket.recv()
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd is not None else None
            if code is not None and REFUSAL_CLOSE_BASE + 100 <= code < REFUSAL_CLOSE_BASE + 600:
                assert closed.rcvd is not None
                status = code - REFUSAL_CLOSE_BASE
                error = self._status_error("WebSocket reattach", status, closed.rcvd.reason, None)
                raise UpgradeRefused(error, by_close=True) from closed
        except TimeoutError:
            pass
        await socket.close()
