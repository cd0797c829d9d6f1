"""ACP over HTTP: POSTs in, Server-Sent Events out (the reference client's contract, docs/wire-contract.md §13).

The order of things, as the Rust `HttpClient` does them:

* The first message must be a single `initialize` request. Its POST answers 200 with the reply
  in the body and `Acp-Connection-Id` in the headers (kept even on an error status, so the
  connection is deleted). An error reply is passed up and no connection is kept: the client may
  initialize again.
* Then the connection stream (GET, no session header) is opened, and every later call waits
  until its response headers arrived.
* A message naming `params.sessionId` first opens that session's stream (and waits for it); a
  reply naming a session (`result.sessionId`: `session/new`, `session/fork`, `session/resume`,
  an extension method) opens its stream at once.
* Call POSTs go one at a time in the order they were sent. Response-only POSTs use their own
  lane and may pass a call POST that is still pending. A response to an agent request that came
  on a session stream carries that `Acp-Session-Id` (the TS server requires it); responses to
  connection-stream requests, `$/cancel_request` and batches carry none.
* Any non-2xx answer, any stream ending, and any timeout is fatal: the connection is DELETEd
  once, the inbox ends with the error, and later sends raise `TransportClosedError`.
* Malformed SSE data is passed up as a JSON-RPC error object (-32700 / -32600) and is not fatal.

Unlike the reference, a dropped stream is reopened when that loses nothing
(docs/resumable-streams.md): the stream carried event ids, or the server advertised resuming in
`initialize`'s `result._meta["acp-channels/resume"]`. The `ReconnectPolicy` (`Backoff` by
default) gives the delay before each retry GET, which carries `Last-Event-ID`, or None to give
up (fatal: `ReconnectGaveUpError`). Events a server sends again (an id at or before the last one
delivered, same stream tag) are skipped. A 409 to a resuming GET (the events are gone, or the
id is foreign) is fatal (`ResumeRefusedError`); so is a 404 (the connection is gone: ended or forgotten)
unless `restart` is on: then a new connection is initialized with the same params and every
open session is `session/load`ed (see `ReconnectEvent`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Iterable, Mapping
from typing import Any, Final

import httpx

from acp_channels import _protocol as protocol
from acp_channels._protocol import Batch, Frame, Malformed, Single

from ._base import FrameValue, cancel_and_wait, frame_value_for_send, response_only
from ._errors import (
    ClientUsageError,
    HttpStatusError,
    ProtocolViolationError,
    ResumeRefusedError,
    TransportError,
)
from ._h2_transport import fair_h2_transport
from ._http_requests import JSON, is_2xx, post_body
from ._reconnect import ReconnectCallback, ReconnectPolicy, StreamDrop, gone_detail
from ._retry import RetryAfter, RetryCallback
from ._sse_streams import SseStreams
from ._tls import h2_available, tls_context
from ._token_source import BearerCredentials

__all__ = ["HttpTransport", "ReconnectPolicy", "StreamDrop"]

logger = logging.getLogger("acp_channels.client")


def _same_id(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _new_http_client(
    cookies: httpx.Cookies | dict[str, str] | None,
    timeout: float | None,
    http2: bool | None,
    verify: ssl.SSLContext | str | bool,
) -> httpx.AsyncClient:
    """The httpx client a transport makes for itself: HTTP/2 when asked (None: when h2 is installed)."""
    if http2 is None:
        http2 = h2_available()
    elif http2 and not h2_available():
        raise ClientUsageError("http2=True needs the h2 package: pip install 'acp-channels[http2]'")
    # Over HTTP/1.1 every open stream holds a connection: no cap, or many sessions
    # would deadlock. Over HTTP/2 (offered through ALPN on https://; otherwise HTTP/1.1)
    # all of them share one connection, up to the server's stream limit.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=20)
    # True keeps httpx's own default (its CA bundle, SSL_CERT_FILE); the rest is ours.
    context: ssl.SSLContext | bool = True if verify is True else tls_context(verify)
    return httpx.AsyncClient(
        cookies=cookies,
        timeout=httpx.Timeout(timeout),
        headers={"User-Agent": "acp-channels-client"},
        transport=(
            fair_h2_transport(http2=True, verify=context, limits=limits)
            if http2
            else httpx.AsyncHTTPTransport(verify=context, limits=limits)
        ),
    )


class HttpTransport(SseStreams):
    """POST + SSE. Use it through `HttpClient`. Its layers: the requests to the endpoint
    (http_requests), the streams (sse_streams), reconnecting and restarting (reconnect); here,
    sending in order and the connection's life."""

    kind: Final = "http"
    closed_text = "transport closed while waiting for a stream to open"

    def __init__(
        self,
        endpoint: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = 30.0,
        stream_idle_timeout: float | None = None,
        http_client: httpx.AsyncClient | None = None,
        cookies: httpx.Cookies | dict[str, str] | None = None,
        reconnect: ReconnectPolicy | None = None,
        restart: bool = False,
        on_reconnect: ReconnectCallback | None = None,
        max_message_size: int = 64 * 1024 * 1024,
        secrets: Iterable[str] = (),
        retry_after: RetryAfter | None = None,
        on_retry: RetryCallback | None = None,
        http2: bool | None = None,
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
        self._retry_after = retry_after
        self._on_retry = on_retry
        self._stream_idle_timeout = stream_idle_timeout
        self._restart_task: asyncio.Task[None] | None = None
        self._owns_client = http_client is None
        if http_client is None:
            http_client = _new_http_client(cookies, timeout, http2, verify)
        elif http2 is not None or verify is not True:
            raise ClientUsageError("http2 and verify configure the client made here: set them on http_client")
        elif cookies is not None:
            http_client.cookies.update(cookies)
        self.http = http_client
        self._call_lane = asyncio.Lock()
        self._response_lane = asyncio.Lock()
        self._initialized = False
        self._initializing = False
        self._streams = {}
        self._agent_request_routes = {}
        self._delete_task: asyncio.Task[None] | None = None
        self.deletes_sent = 0
        self.http_version = None

    # --------------------------------------------------------------------------------- sending

    async def connect(self) -> None:
        """Nothing to do before the first POST (kept for symmetry with the WebSocket transport)."""
        self._raise_if_unusable()

    async def send(self, frame: Any, *, raw: str | None = None) -> None:
        value = frame_value_for_send(frame)
        self._raise_if_unusable()
        parsed = protocol.frame_from_value(value)
        if response_only(value):
            if not self._initialized:
                raise ClientUsageError("ACP HTTP transport: first message must be `initialize`")
            await self._send_response(value, raw)
            return
        initialize = isinstance(parsed, Single) and protocol.initialize_entry(parsed) == 0
        sessions: list[str] = []
        if initialize:
            if self._initialized:
                raise ClientUsageError("already initialized: `initialize` would open a second connection")
        else:
            if not self._initialized and not self._initializing:
                raise ClientUsageError("ACP HTTP transport: first message must be a single `initialize` request")
            sessions = self._sessions_of(parsed)
        async with self._call_lane:
            self._raise_if_failed()
            if initialize:
                if self._initialized:
                    raise ClientUsageError("already initialized: `initialize` would open a second connection")
                await self._initialize(value, raw)
                return
            if not self._initialized:
                raise ClientUsageError("ACP HTTP transport: the connection is not initialized")
            await self._wait_established(None)
            for session_id in sessions:
                await self._wait_established(session_id)
            headers = self._post_headers()
            if isinstance(parsed, Single) and (header := protocol.message_session_id(parsed.message)) is not None:
                headers["Acp-Session-Id"] = header
            self._ledger.sent(value)
            await self._post(value, headers, self._describe(parsed), raw)

    def _sessions_of(self, frame: Frame) -> list[str]:
        """Session ids the frame names, checking session methods have one (before any effect)."""
        sessions: list[str] = []
        for message in protocol.frame_messages(frame):
            if "method" not in message:
                continue
            session_id = protocol.message_session_id(message)
            if session_id is None:
                if message["method"] in protocol.SESSION_SCOPED_METHODS:
                    raise ClientUsageError(f"{message['method']} needs params.sessionId")
            elif session_id not in sessions:
                sessions.append(session_id)
        return sessions

    @staticmethod
    def _describe(frame: Frame) -> str:
        if isinstance(frame, Single) and "method" in frame.message:
            return f"POST {frame.message['method']}"
        if isinstance(frame, Batch):
            return "POST batch"
        return "POST"

    async def _send_response(self, value: FrameValue, raw: str | None) -> None:
        async with self._response_lane:  # headers inside: a restart may change the connection
            self._raise_if_failed()
            if self._ledger.stale_answer(value):
                assert isinstance(value, dict)
                logger.info("dropped an answer to request %s of the connection that was lost", value["id"])
                return
            self._ledger.sent(value)
            headers = self._post_headers()
            if isinstance(value, dict) and "id" in value:
                session_id = self._session_of_request(value["id"])
                if session_id is not None:
                    headers["Acp-Session-Id"] = session_id
            await self._post(value, headers, "POST response", raw)

    async def _wait_established(self, session_id: str | None) -> None:
        if self._restart_task is not None and asyncio.current_task() is not self._restart_task:
            return  # the connection is being replaced: what is sent now finds it gone (answered by the restart)
        stream = self._open_stream(session_id)
        if stream is None:
            raise self._closed_error()
        if not stream.established.done():
            await self._unless_failed(asyncio.shield(stream.established), self._closing)

    # ------------------------------------------------------------------------------ initialize

    async def _initialize(self, value: FrameValue, raw: str | None) -> None:
        assert isinstance(value, dict)
        self._initializing = True
        self._ledger.sent(value)
        try:
            response, connection_id = await self._post_initialize(value, raw, "initialize", self._attach_headers)
            frame = protocol.parse_frame(response.text)
            if isinstance(frame, Batch):
                raise self._fail(ProtocolViolationError("initialize response must not be a JSON-RPC batch"))
            if isinstance(frame, Malformed):
                snippet = response.text[:200]
                raise self._fail(ProtocolViolationError(f"initialize response is not a JSON-RPC message: {snippet!r}"))
            reply = frame.message
            if "method" in reply or not _same_id(reply.get("id"), value.get("id")):
                raise self._fail(ProtocolViolationError("initialize response does not answer the initialize request"))
            if "error" in reply:
                # Rejected: no connection is kept and the client may try again.
                if connection_id is not None:
                    await self._delete(connection_id)
                    self.connection_id = None
                self._inbox.put(reply, response.text)
                return
            if connection_id is None:
                raise self._fail(ProtocolViolationError("server did not return acp-connection-id header"))
            self._initialized = True
            self._ledger.received(reply)
            if self._ledger.attach_failure is not None:
                raise self._fail(ProtocolViolationError(self._ledger.attach_failure))
            self._inbox.put(reply, response.text)
            await self._wait_established(None)
            if (attachment := self._ledger.attachment) is not None:
                # What the session retained, then everything live, comes on its stream.
                await self._wait_established(attachment.session_id)
        finally:
            self._initializing = False

    # ----------------------------------------------------------------------------- restart

    def _connection_gone(self, error: HttpStatusError, connection_id: str | None, what: str = "") -> bool:
        """The server answered 404 for `connection_id`: start a restart when allowed (True),
        else fail with a `ResumeRefusedError` saying why (False)."""
        if self._close_started or self.error is not None:
            return False
        if connection_id is not None and connection_id != self.connection_id:
            return True  # about a connection a restart already replaced
        if self._restart_task is not None:
            return True
        refusal = self._ledger.restart_refusal() if self._restart else "restart is off"
        if refusal is not None or connection_id is None:
            refusal = refusal or "the request named no connection"
            gone = ResumeRefusedError(error.request, 404, error.body, detail=gone_detail(connection_id, refusal))
            if what:
                self._give_up(what, gone)
            else:
                self._fail(gone)
            return False
        self._restart_task = asyncio.create_task(self._restart_connection(connection_id), name="acp-client restart")
        return True

    async def _restart_connection(self, previous: str) -> None:
        """A new connection in place of `previous`, which the server forgot (see
        `_restart_in_place`); its streams are reopened as they are needed."""
        try:
            # Before taking the lanes: a send waiting for a stream to open goes on (see _wait_established).
            await self._stop_streams()
            async with self._call_lane, self._response_lane:
                if self.closed:
                    return
                event = await self._restart_in_place("connection", previous)
            self._tell(event)
        except TransportError as exc:
            self._fail(exc)
        finally:
            self._restart_task = None

    async def _connect_again(self) -> None:
        """POST `initialize` again with the caller's params, then open the connection stream."""
        self._agent_request_routes.clear()
        self.connection_id = None
        message = self._ledger.initialize_request()
        what = "initialize (restart)"
        response, connection_id = await self._post_initialize(message, None, what)
        frame = protocol.parse_frame(response.text)
        reply = frame.message if isinstance(frame, Single) else None
        if reply is None or reply.get("id") != message["id"] or "error" in reply or connection_id is None:
            raise self._fail(ProtocolViolationError(f"{what}: the server did not accept it: {response.text[:200]!r}"))
        self._ledger.initialize_id = None  # the caller's initialize was answered long ago
        self._ledger.received(reply)
        self._ledger.initialized = True
        await self._wait_established(None)

    async def _send_private(self, message: protocol.Message) -> dict[str, Any] | None:
        """POST a restart's own request once its session's stream is open (the reply may come
        in the POST's answer)."""
        session_id = protocol.message_session_id(message)
        if session_id is not None:
            await self._wait_established(session_id)
        headers = self._post_headers()
        if session_id is not None:
            headers["Acp-Session-Id"] = session_id
        what = f"POST {message['method']} (restart)"
        response = await self._exchange("POST", what, headers, post_body(message, None))
        if not is_2xx(response):
            raise self._fail(self._response_error(what, response, response.text))
        if response.headers.get("content-type", "").startswith(JSON) and response.content:
            body = protocol.parse_frame(response.text)  # a server may answer in the body
            if isinstance(body, Single) and body.message.get("id") == message["id"]:
                return body.message
        return None

    # ------------------------------------------------------------------------------- the end

    def _fail(self, error: TransportError) -> TransportError:
        if not self._record_failure(error, logger):
            return error
        current = asyncio.current_task()
        for stream in self._streams.values():
            if stream.task is not None and stream.task is not current:
                stream.task.cancel()
        self._inbox.end(error)
        if self.connection_id is not None:
            self._delete_task = asyncio.ensure_future(self._delete(self.connection_id))
        return error

    async def _shut_down(self) -> None:
        """Finish the sends under way, DELETE the connection once, stop the streams."""
        await cancel_and_wait([self._restart_task])
        async with self._call_lane, self._response_lane:
            pass  # sends already queued go out first, in order
        if self._delete_task is not None:
            await asyncio.shield(self._delete_task)
        elif self.connection_id is not None and self.error is None and not self._leave_on_server:
            await self._delete(self.connection_id)
        await cancel_and_wait([stream.task for stream in self._streams.values()])
        self._inbox.end(None)
        if self._owns_client:
            await self.http.aclose()
