"""`HttpClient`: one ACP client transport for both shapes of the ACP HTTP transport.

    HttpClient("http://host:8000")        # POST + SSE on http://host:8000/acp
    HttpClient("wss://host/agents/acp")   # one WebSocket on that URL
    HttpClient(url, token=os.environ["ACP_TOKEN"])   # Authorization: Bearer <token> on everything

It is an `acp` SDK transport (`send(dict)`, `receive() -> dict | None`, `close()`), so
`acp.connect_to_agent(my_client, HttpClient(url))` talks to a remote agent, and it is an async
context manager for sending and receiving raw JSON-RPC frames (`receive_frame()` keeps batches).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Final, Literal, TypeAlias, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx

from ._base import FrameValue, RawFrame, credential_secrets
from ._directory import SessionDirectory, directory_url, fetch_directory, http_endpoint
from ._errors import (
    AuthenticationError,
    ClientUsageError,
    NetworkError,
    TransportError,
    TransportTimeoutError,
    status_error,
)
from ._reconnect import DEFAULT_BACKOFF, ReconnectCallback, ReconnectPolicy
from ._retry import DEFAULT_RETRY_AFTER, RetryAfter, RetryCallback
from ._shared_sessions import Attachment, AttachRole, attach_headers, with_operation_ids
from ._token_source import BearerCredentials, TokenSource, check_token, invalid_token_challenge
from ._transport_http import HttpTransport, _new_http_client
from ._transport_ws import WebSocketTransport

__all__ = [
    "DEFAULT_TIMEOUT",
    "SUBPROTOCOL",
    "TOKEN_SUBPROTOCOL_PREFIX",
    "HttpClient",
    "check_token",
    "resolve_endpoint",
    "shown_url",
]

DEFAULT_TIMEOUT = 30.0
_SCHEMES: dict[str, Literal["http", "ws"]] = {"http": "http", "https": "http", "ws": "ws", "wss": "ws"}

#: The WebSocket subprotocol a server accepts; a browser offers the token as a second one.
SUBPROTOCOL: Final = "acp"
TOKEN_SUBPROTOCOL_PREFIX: Final = "acp.bearer."
WebSocketToken: TypeAlias = Literal["header", "subprotocol"]
T = TypeVar("T")


def shown_url(url: str) -> str:
    """`url` without a user:password part, for logs and reprs."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def resolve_endpoint(url: str, *, exact: bool = False) -> tuple[str, Literal["http", "ws"]]:
    """The endpoint URL and the transport its scheme selects. `/acp` is appended to the path
    unless it already ends with it (exact=True keeps the URL as given, query included)."""
    parts = urlsplit(url)
    kind = _SCHEMES.get(parts.scheme.lower())
    if kind is None or not parts.netloc:
        raise ClientUsageError(f"not an http(s):// or ws(s):// URL: {url!r}")
    if exact:
        return url, kind
    path = parts.path.rstrip("/")
    if not path.endswith("/acp"):
        path += "/acp"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, "")), kind


class HttpClient:
    """An ACP client transport over HTTP+SSE (http/https URLs) or WebSocket (ws/wss URLs).

    Args:
        url: the server; `/acp` is appended unless the path already ends with it.
        token: a bearer token, sent as `Authorization: Bearer <token>` on every request (POST,
            the GET streams, DELETE, the session directory) and on the WebSocket upgrade: a
            string (fixed), or a `TokenSource` whose current token each request reads as it is
            built. A 401 with `error="invalid_token"` makes the client ask the source for a new
            one (`refresh`, once for all the requests refused with that token) and send the
            request once more; so does the server's notice that the token expires (ahead of
            time, in the background), and a stream or socket the server closed at expiry is
            resumed with the new token (docs/client.md). Never shown in a repr or an error.
        websocket_token: "header" (default) or "subprotocol": send the token on the WebSocket
            upgrade as the old browser form did, offering subprotocols `acp` and
            `acp.bearer.<token>` (deprecated: servers refuse it unless configured; the token
            must be a fixed string of RFC 6455 token characters, e.g. base64url).
        headers: sent on every request and on the WebSocket upgrade (an Authorization header
            here instead of `token` works too; not both).
        timeout: seconds for each POST/DELETE answer, for a stream's response headers, and for
            the WebSocket handshake; None waits forever. A timeout is fatal.
        stream_idle_timeout: HTTP only; an SSE stream silent this long counts as dropped
            (servers send keep-alives every 15 s). None (default) never gives up.
        cookies: initial cookies; cookies the server sets are kept for the connection.
        http_client: an `httpx.AsyncClient` to use (HTTP only; not closed by us).
        reconnect: how to retry a dropped SSE stream or WebSocket (docs/resumable-streams.md):
            a `ReconnectPolicy`, by default `Backoff()` (at once, then 0.1 s doubling to 5 s,
            fatal 30 s after the drop); None: every drop is fatal, as in the reference client.
            A stream or socket is only reconnected when that loses nothing and repeats nothing:
            SSE when the stream carried event ids or the server advertised resuming; WebSocket
            when the server advertised it and named the connection in the 101.
        restart: when the server has forgotten the connection (404 on resume), start a new one:
            initialize with the same params and `session/load` every open session (the agent
            must advertise `loadSession`). Messages the agent sent after the drop are lost and
            requests left unanswered get an error reply; `on_reconnect` is told. Off by default.
        on_reconnect: called with a `ReconnectEvent` when a stream or the socket drops and is
            retried ("reconnecting"), is back ("resumed"), was replaced ("restarted"), or the
            client gives up ("gave-up"). `reconnecting` says whether one is under way.
        max_message_size: the largest message accepted (SSE event or WebSocket message).
        exact_url: use `url` as is, without appending `/acp`.
        retry_after: HTTP only; a 503 or 429 answer with `Retry-After` (the server did nothing:
            it is full, draining, or its worker is too busy) to `initialize`, a POST or a stream
            GET is sent again after that delay: a `RetryAfter` policy, by default `RetryAfter()`
            (delays capped at 10 s, given up 60 s after the first refusal); None: such an answer
            is fatal at once, like any other error status.
        on_retry: HTTP only; called with a `RetryEvent` before each such retry (each is also
            logged at INFO on the `acp_channels.client` logger).
        http2: HTTP only; offer HTTP/2 on https:// URLs (through TLS ALPN: the server picks, and
            one that does not speak it is spoken to over HTTP/1.1). All of the connection's
            POSTs and streams then share one TCP connection. None (default): offered when the
            `h2` package is installed (`pip install 'acp-channels[http2]'`). http:// URLs always
            use HTTP/1.1 (docs/http2.md).
        verify: how an https:// or wss:// server's certificate is checked: True (default) the
            usual CAs (httpx's bundle; the system's for wss://), a CA file path (a self-signed
            development certificate), an `ssl.SSLContext`, or False (no check: tests only).
        attach: a live session's id: instead of starting an agent, the client attaches to that
            session (docs/shared-sessions.md): its `initialize` (HTTP: the POST; WebSocket: the
            upgrade) asks for it, `attachment` says what it attached to, and the session's
            stream brings what the session retained, then everything live. `close()` and
            `detach()` detach; `terminate()` ends the session's connection.
        role: with `attach`, "controller" (default: prompts and answers) or "observer" (watches;
            whatever it sends to the agent is refused with -32011).

    Every `session/prompt` sent without a `raw` text gets an operation id
    (`params._meta["acp-channels/operationId"]`, a UUID) unless it has one: a prompt sent again
    is then run once. Over HTTP a POST whose every request has one is sent again, the same
    bytes, when its answer is lost (the reconnect policy decides how long; told as reconnecting
    `POST session/prompt`); over WebSocket a reattach sends again what the server did not get.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | TokenSource | None = None,
        websocket_token: WebSocketToken = "header",
        headers: Mapping[str, str] | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        stream_idle_timeout: float | None = None,
        cookies: httpx.Cookies | dict[str, str] | None = None,
        http_client: httpx.AsyncClient | None = None,
        reconnect: ReconnectPolicy | None = DEFAULT_BACKOFF,
        restart: bool = False,
        on_reconnect: ReconnectCallback | None = None,
        max_message_size: int = 64 * 1024 * 1024,
        exact_url: bool = False,
        retry_after: RetryAfter | None = DEFAULT_RETRY_AFTER,
        on_retry: RetryCallback | None = None,
        http2: bool | None = None,
        verify: ssl.SSLContext | str | bool = True,
        attach: str | None = None,
        role: AttachRole = "controller",
    ) -> None:
        self.url, self.kind = resolve_endpoint(url, exact=exact_url)
        attaching = attach_headers(attach, role)
        #: The session asked for with `attach` (None: a connection of its own), and the role.
        self.attach_session_id = attach
        self.attach_role: AttachRole = role
        headers = dict(headers or {})
        subprotocols: list[str] = []
        if websocket_token not in ("header", "subprotocol"):
            raise ClientUsageError('websocket_token is "header" or "subprotocol"')
        if websocket_token == "subprotocol" and (self.kind != "ws" or token is None):
            raise ClientUsageError('websocket_token="subprotocol" needs a token and a ws(s):// URL')
        credentials: BearerCredentials | None = None
        if token is not None:
            if any(name.lower() == "authorization" for name in headers):
                raise ClientUsageError("give a token or an Authorization header, not both")
            credentials = BearerCredentials(token, timeout=timeout)
            if websocket_token == "subprotocol":
                # The deprecated form keeps a fixed token: a subprotocol offered once cannot follow a source.
                if not isinstance(token, str):
                    raise ClientUsageError('websocket_token="subprotocol" takes a fixed token (a str), not a source')
                check_token(token, subprotocol=True)
                subprotocols = [SUBPROTOCOL, TOKEN_SUBPROTOCOL_PREFIX + token]
        secrets = (token,) if isinstance(token, str) else ()
        #: The token on every request (the directory's too: a plain GET always carries it in Authorization).
        self._credentials = credentials
        self._directory_headers = dict(headers)
        self._directory_secrets = credential_secrets(self._directory_headers, secrets)
        self._timeout = timeout
        self._verify = verify
        self._http2 = http2
        self._transport: HttpTransport | WebSocketTransport
        if self.kind == "http":
            self._transport = HttpTransport(
                self.url,
                headers=headers,
                secrets=secrets,
                timeout=timeout,
                stream_idle_timeout=stream_idle_timeout,
                http_client=http_client,
                cookies=cookies,
                reconnect=reconnect,
                restart=restart,
                on_reconnect=on_reconnect,
                max_message_size=max_message_size,
                retry_after=retry_after,
                on_retry=on_retry,
                http2=http2,
                verify=verify,
                attach=attaching,
                credentials=credentials,
            )
        else:
            if http_client is not None or stream_idle_timeout is not None or http2 is not None:
                raise ClientUsageError("http_client, stream_idle_timeout and http2 are for http(s):// URLs")
            self._transport = WebSocketTransport(
                self.url,
                headers=headers,
                timeout=timeout,
                cookies=cookies,
                max_message_size=max_message_size,
                subprotocols=subprotocols,
                secrets=secrets,
                reconnect=reconnect,
                restart=restart,
                on_reconnect=on_reconnect,
                verify=verify,
                attach=attaching,
                credentials=credentials if websocket_token == "header" else None,
            )

    def __repr__(self) -> str:
        # Headers and token are never shown.
        return f"HttpClient({shown_url(self.url)!r}, kind={self.kind!r}, connection_id={self.connection_id!r})"

    @property
    def transport(self) -> HttpTransport | WebSocketTransport:
        """The transport doing the work (HttpTransport or WebSocketTransport)."""
        return self._transport

    @property
    def connection_id(self) -> str | None:
        """`Acp-Connection-Id` of the connection (WebSocket: from the 101, when the server sent it)."""
        return self._transport.connection_id

    @property
    def http_version(self) -> str | None:
        """HTTP only: the version the server last answered with ("HTTP/2" or "HTTP/1.1"; None
        before the first answer, and over WebSocket)."""
        return self._transport.http_version if isinstance(self._transport, HttpTransport) else None

    @property
    def attachment(self) -> Attachment | None:
        """With `attach`: what the client attached to, once the initialize result said (the
        session, the connection hosting it, the role, whether a turn was running). None before
        that, and for a connection of its own."""
        return self._transport.attachment

    @property
    def load_session(self) -> bool:
        """The agent advertised `agentCapabilities.loadSession` (known after initialize)."""
        return self._transport.load_session

    @property
    def error(self) -> TransportError | None:
        """The error that ended the transport, if one did."""
        return self._transport.error

    @property
    def closed(self) -> bool:
        """True once closed or failed."""
        return self._transport.closed

    @property
    def cookies(self) -> httpx.Cookies:
        return self._transport.cookies

    @property
    def reconnecting(self) -> bool:
        """A dropped stream or socket is being reconnected right now (see `on_reconnect`)."""
        return self._transport.reconnecting

    async def wait_failed(self) -> TransportError:
        """Wait until the transport fails (never returns after a clean close); returns the error."""
        return await self._transport.wait_failed()

    async def list_sessions(self) -> SessionDirectory:
        """The session directory (`GET <endpoint>/sessions`, over http(s) for a ws(s) URL too):
        the live sessions and connections this client's principal may see, sessions the most
        recently active first. Needs no open ACP connection (before, during or after one) and
        sends the client's credentials, cookies and TLS settings, within its `timeout`.

        Raises `AuthenticationError` (401, 403), `HttpStatusError` (any other status but 200:
        404 from a server without a directory), `TransportTimeoutError`, `NetworkError`, and
        `ProtocolViolationError` when the answer is not a directory. These do not end the
        transport."""
        transport = self._transport
        if isinstance(transport, HttpTransport) and not transport.http.is_closed:
            return await self._fetch_directory(transport.http)
        # A WebSocket client, or one already closed: a client of its own, with the same cookies.
        async with _new_http_client(self.cookies, self._timeout, self._http2, self._verify) as http:
            return await self._fetch_directory(http)

    async def _fetch_directory(self, http: httpx.AsyncClient) -> SessionDirectory:
        async def fetch(headers: dict[str, str]) -> SessionDirectory:
            return await fetch_directory(
                http,
                directory_url(self.url),
                headers=headers,
                timeout=self._timeout,
                redact=self._redact,
                credentials_sent=self._credentials_sent,
            )

        return await self._with_token(fetch)

    async def _with_token(self, request: Callable[[dict[str, str]], Awaitable[T]]) -> T:
        """`request(headers)` with the current token; once more with a new one when it raised a
        401 `error="invalid_token"` and the token source has one."""
        credentials = self._credentials
        if credentials is None:
            return await request(dict(self._directory_headers))
        headers, token = await credentials.authorized(self._directory_headers)
        try:
            return await request(headers)
        except AuthenticationError as refused:
            challenge = refused.www_authenticate
            if refused.status_code != 401 or not invalid_token_challenge(challenge):
                raise
            if not await credentials.replaced(token):
                raise
        headers, _ = await credentials.authorized(self._directory_headers)
        return await request(headers)

    @property
    def _credentials_sent(self) -> bool:
        return self._credentials is not None or any(name.lower() == "authorization" for name in self._directory_headers)

    def _redact(self, text: str) -> str:
        secrets = self._directory_secrets if self._credentials is None else self._credentials.secrets
        for secret in (*secrets, *self._directory_secrets):
            text = text.replace(secret, "***")
        return text

    async def connect(self) -> None:
        """Open the WebSocket now (HTTP: nothing to do). The first send does it otherwise."""
        await self._transport.connect()

    async def send(self, message: FrameValue, *, raw: str | None = None) -> None:
        """Send one frame: a JSON-RPC message (dict) or a batch (list).

        `raw`: the frame's exact JSON text, sent instead of serializing `message` (a relay keeps
        bytes unchanged this way); `message` must be what `raw` parses to, as routing reads it.

        A `session/prompt` without an operation id gets one (not with `raw`: its bytes go as given).

        HTTP: returns once the server accepted the POST (2xx). Raises `ClientUsageError` for a
        frame the transport refuses (nothing sent) and a `TransportError` when it failed."""
        await self._transport.send(message if raw is not None else with_operation_ids(message), raw=raw)

    async def receive(self) -> dict[str, Any] | None:
        """The next message received (a batch is handed out entry by entry), or None once the
        transport was closed. Raises the `TransportError` that ended the transport."""
        return await self._transport.receive()

    async def receive_frame(self) -> FrameValue | None:
        """Like `receive`, but a batch comes as the list it arrived as."""
        return await self._transport.receive_frame()

    async def receive_raw(self) -> RawFrame | None:
        """Like `receive_frame`, with the frame's text as it arrived (`RawFrame.text`; for a
        malformed frame, the JSON of the error object it became)."""
        return await self._transport.receive_raw()

    async def close(self) -> None:
        """Finish sends under way, then DELETE the connection (HTTP) or close the socket (WS):
        that ends the connection and its sessions, or, for an attachment, detaches it."""
        await self._transport.close()

    async def detach(self) -> None:
        """Leave without ending any session: an attachment closes (which detaches it); a
        connection of its own goes without a DELETE (HTTP) or with close code 1001 (WebSocket),
        and the server keeps it (its DETACHED_SECONDS) for a client to attach to its sessions."""
        await self._transport.detach()

    async def terminate(self) -> None:
        """End the connection hosting the session, then close: its agent ends, and every client
        attached to its sessions gets `_acp-channels/session/terminated`. For a connection of
        its own this is `close()`; an attachment first DELETEs the connection its `attachment`
        names. Raises `HttpStatusError` when the server refuses (a connection already gone is
        not an error), `NetworkError`, `TransportTimeoutError`; the client is closed anyway."""
        attachment = self.attachment
        try:
            if attachment is not None:
                transport = self._transport
                if isinstance(transport, HttpTransport) and not transport.http.is_closed:
                    await self._delete_connection(transport.http, attachment.connection_id)
                else:
                    async with _new_http_client(self.cookies, self._timeout, self._http2, self._verify) as http:
                        await self._delete_connection(http, attachment.connection_id)
        finally:
            await self.close()

    async def _delete_connection(self, http: httpx.AsyncClient, connection_id: str) -> None:
        what = "DELETE (terminate)"

        async def delete(headers: dict[str, str]) -> None:
            headers["Acp-Connection-Id"] = connection_id
            try:
                response = await http.request("DELETE", http_endpoint(self.url), headers=headers, timeout=self._timeout)
            except httpx.TimeoutException as exc:
                raise TransportTimeoutError(f"{what}: no answer within {self._timeout}s") from exc
            except httpx.HTTPError as exc:
                raise NetworkError(self._redact(f"{what}: {type(exc).__name__}: {exc}")) from exc
            if not (200 <= response.status_code < 300 or response.status_code == 404):  # 404: it had ended
                challenge = response.headers.get("www-authenticate")
                raise status_error(
                    what,
                    response.status_code,
                    self._redact(response.text[:2000]),
                    www_authenticate=self._redact(challenge) if challenge is not None else None,
                    credentials_sent=self._credentials_sent,
                )

        await self._with_token(delete)

    async def __aenter__(self) -> HttpClient:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def __aiter__(self) -> AsyncIterator[FrameValue]:
        """Frames as they arrive, until the transport is closed (a failure is raised)."""
        while (frame := await self.receive_frame()) is not None:
            yield frame
