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
import collections
import contextlib
import logging
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx

from acp_channels import protocol
from acp_channels.protocol import CONNECTION_HEADER, Batch, Frame, Malformed, Single

from ._base import FrameValue, cancel_and_wait, frame_value_for_send, received, response_only
from .errors import (
    ClientUsageError,
    HttpStatusError,
    NetworkError,
    ProtocolViolationError,
    ReconnectGaveUpError,
    ResumeRefusedError,
    StreamEndedError,
    TransportError,
    TransportTimeoutError,
)
from .h2_transport import fair_h2_transport
from .reconnect import (
    ReconnectCallback,
    ReconnectEvent,
    ReconnectingTransport,
    ReconnectPolicy,
    StreamDrop,
    gone_detail,
)
from .retry import RetryAfter, RetryCallback, RetryEvent, retry_after_seconds
from .sse import SseParser, SseTooLarge
from .tls import h2_available, tls_context

__all__ = ["HttpTransport", "ReconnectPolicy", "StreamDrop"]

logger = logging.getLogger("acp_channels.client")

JSON: Final = "application/json"
EVENT_STREAM: Final = "text/event-stream"
LAST_EVENT_ID: Final = "Last-Event-ID"
_ERROR_BODY_LIMIT: Final = 2000


#: Statuses of a retry GET worth another try: the server (or a balancer) is busy or restarting.
_RETRY_STATUSES: Final = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(eq=False)
class _Stream:
    session_id: str | None
    established: asyncio.Future[None]
    task: asyncio.Task[None] | None = None
    last_event_id: str | None = None
    #: (tag, seq) of the last event delivered, when its id has our server's form.
    position: tuple[str, int] | None = None
    attempts: int = 0
    connected: bool = False
    #: loop time of the drop being retried (None while the stream is up).
    dropped_at: float | None = None

    @property
    def name(self) -> str:
        return "connection stream" if self.session_id is None else f"session stream {self.session_id!r}"


def event_position(event_id: str) -> tuple[str, int] | None:
    """(tag, seq) of an SSE id of our server's form `<tag>-<seq>`; None for any other id (then
    it is only echoed back, never compared)."""
    tag, dash, seq = event_id.rpartition("-")
    if not dash or not seq.isascii() or not seq.isdigit():
        return None
    return tag, int(seq)


def _is_2xx(response: httpx.Response) -> bool:
    return 200 <= response.status_code < 300


def _same_id(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _body(value: FrameValue, raw: str | None) -> bytes:
    """The POST body: the caller's exact text when it gave one (a relay), else `value` as JSON."""
    return (raw if raw is not None else protocol.dumps(value)).encode()


class HttpTransport(ReconnectingTransport):
    """POST + SSE. Use it through `HttpClient`."""

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
        )
        self._retry_after = retry_after
        self._on_retry = on_retry
        self._stream_idle_timeout = stream_idle_timeout
        self._restart_task: asyncio.Task[None] | None = None
        self._owns_client = http_client is None
        if http_client is None:
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
            http_client = httpx.AsyncClient(
                cookies=cookies,
                timeout=httpx.Timeout(timeout),
                headers={"User-Agent": "acp-channels-client"},
                transport=(
                    fair_h2_transport(http2=True, verify=context, limits=limits)
                    if http2
                    else httpx.AsyncHTTPTransport(verify=context, limits=limits)
                ),
            )
        elif http2 is not None or verify is not True:
            raise ClientUsageError("http2 and verify configure the client made here: set them on http_client")
        elif cookies is not None:
            http_client.cookies.update(cookies)
        self.http = http_client
        self._call_lane = asyncio.Lock()
        self._response_lane = asyncio.Lock()
        self._initialized = False
        self._initializing = False
        self._streams: dict[str | None, _Stream] = {}
        self._agent_request_routes: dict[str, collections.deque[str | None]] = {}
        self._delete_task: asyncio.Task[None] | None = None
        self.deletes_sent = 0
        #: The HTTP version of the last answer from the server ("HTTP/2", "HTTP/1.1"; None before).
        self.http_version: str | None = None

    @property
    def cookies(self) -> httpx.Cookies:
        return self.http.cookies

    def stream_event_id(self, session_id: str | None = None) -> str | None:
        """The last SSE event id seen on a stream (None: no such stream or no ids)."""
        stream = self._streams.get(session_id)
        return stream.last_event_id if stream else None

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
                key = protocol.id_key(value["id"])
                routes = self._agent_request_routes.get(key)
                if routes:
                    route = routes.popleft()
                    if not routes:
                        del self._agent_request_routes[key]
                    if route is not None:
                        headers["Acp-Session-Id"] = route
            await self._post(value, headers, "POST response", raw)

    def _post_headers(self) -> dict[str, str]:
        headers = {**self._headers, "Content-Type": JSON, "Accept": JSON}
        if self.connection_id is not None:
            headers["Acp-Connection-Id"] = self.connection_id
        return headers

    async def _post(self, value: FrameValue, headers: dict[str, str], what: str, raw: str | None) -> httpx.Response:
        response = await self._exchange("POST", what, headers, _body(value, raw))
        logger.debug("%s: HTTP %d", what, response.status_code)
        if not _is_2xx(response):
            error = self._response_error(what, response, response.text)
            gone = response.status_code == 404 and self._restart
            if gone and self._connection_gone(error, headers.get("Acp-Connection-Id")):
                return response  # a restart answers the request (an error: it was not delivered)
            raise self._fail(error)
        return response

    def _response_error(self, what: str, response: httpx.Response, body: str) -> HttpStatusError:
        challenge = response.headers.get("www-authenticate")
        return self._status_error(what, response.status_code, body[:_ERROR_BODY_LIMIT], challenge)

    async def _exchange(
        self, method: str, what: str, headers: dict[str, str], content: bytes | None = None
    ) -> httpx.Response:
        """One request/response, read whole; a timeout or network failure is fatal. A 503 or 429
        with Retry-After is sent again after the delay while the retry policy allows."""
        refused_at: float | None = None
        attempt = 0
        while True:
            response = await self._exchange_once(method, what, headers, content)
            delay, refused_at = self._busy_delay(what, response, response.text, attempt, refused_at)
            if delay is None:
                return response
            attempt += 1
            await self._wait_retry(delay)

    async def _exchange_once(
        self, method: str, what: str, headers: dict[str, str], content: bytes | None
    ) -> httpx.Response:
        request = self.http.request(method, self.endpoint, headers=headers, content=content, timeout=self._timeout)
        try:
            response = await self._unless_failed(request)
        except httpx.TimeoutException as exc:
            raise self._fail(TransportTimeoutError(f"{what}: no answer within {self._timeout:g}s")) from exc
        except httpx.HTTPError as exc:
            raise self._fail(NetworkError(self.redact(f"{what}: {type(exc).__name__}: {exc}"))) from exc
        self.http_version = response.http_version
        return response

    def _busy_delay(
        self, what: str, response: httpx.Response, body: str, attempt: int, refused_at: float | None
    ) -> tuple[float | None, float | None]:
        """(seconds before sending the request again, or None; when the first refusal came):
        a 503/429 with Retry-After within the retry policy's deadline. Tells the caller."""
        retry_after = retry_after_seconds(response.status_code, response.headers)
        if self._retry_after is None or retry_after is None:
            return None, refused_at
        now = asyncio.get_running_loop().time()
        refused_at = now if refused_at is None else refused_at
        delay = self._retry_after.delay(retry_after, now - refused_at)
        if delay is None:
            logger.warning("%s: HTTP %d for %.1fs; giving up", what, response.status_code, now - refused_at)
            return None, refused_at
        event = RetryEvent(what, response.status_code, delay, attempt + 1, now - refused_at, self.redact(body[:200]))
        logger.info("%s", event)
        if self._on_retry is not None:
            try:
                self._on_retry(event)
            except Exception:
                logger.exception("the on_retry callback failed")
        return delay, refused_at

    async def _wait_retry(self, delay: float) -> None:
        """The server's Retry-After delay; a close or a failure meanwhile ends the wait."""
        await self._unless_failed(asyncio.sleep(delay), self._closing)

    # ------------------------------------------------------------------------------ initialize

    async def _initialize(self, value: FrameValue, raw: str | None) -> None:
        assert isinstance(value, dict)
        self._initializing = True
        self._ledger.sent(value)
        try:
            response, connection_id = await self._post_initialize(value, raw, "initialize")
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
            self._inbox.put(reply, response.text)
            await self._wait_established(None)
        finally:
            self._initializing = False

    async def _post_initialize(
        self, message: FrameValue, raw: str | None, what: str
    ) -> tuple[httpx.Response, str | None]:
        """POST an `initialize` (no connection yet): its 2xx answer, and the connection id that
        answer names (kept as `connection_id` even on an error status, so that it is deleted)."""
        headers = {**self._headers, "Content-Type": JSON, "Accept": JSON}
        response = await self._exchange("POST", what, headers, _body(message, raw))
        logger.debug("POST %s: HTTP %d", what, response.status_code)
        connection_id = protocol.header_value(response.headers.get_list(CONNECTION_HEADER)) or None
        if connection_id is not None:
            self.connection_id = connection_id
        if not _is_2xx(response):
            raise self._fail(self._response_error(what, response, response.text))
        return response, connection_id

    # --------------------------------------------------------------------------------- streams

    def _open_stream(self, session_id: str | None) -> _Stream | None:
        stream = self._streams.get(session_id)
        if stream is not None:
            return stream
        if self.closed:
            return None
        stream = _Stream(session_id, asyncio.get_running_loop().create_future())
        self._streams[session_id] = stream
        stream.task = asyncio.create_task(self._run_stream(stream), name=f"acp-client {stream.name}")
        return stream

    async def _wait_established(self, session_id: str | None) -> None:
        if self._restart_task is not None and asyncio.current_task() is not self._restart_task:
            return  # the connection is being replaced: what is sent now finds it gone (answered by the restart)
        stream = self._open_stream(session_id)
        if stream is None:
            raise self._closed_error()
        if not stream.established.done():
            await self._unless_failed(asyncio.shield(stream.established), self._closing)

    async def _run_stream(self, stream: _Stream) -> None:
        while True:
            sent_event_id = stream.last_event_id or None
            connection_id = self.connection_id
            try:
                await self._read_stream(stream)
                error: TransportError = StreamEndedError(stream.session_id)
            except TransportError as exc:
                error = exc
            except SseTooLarge as exc:
                self._fail(ProtocolViolationError(f"{stream.name}: {exc}"))
                return
            except httpx.TimeoutException:
                idle = self._stream_idle_timeout
                error = StreamEndedError(stream.session_id, f"no data for {idle:g}s" if idle else "read timed out")
            except httpx.HTTPError as exc:
                error = StreamEndedError(stream.session_id, f"{type(exc).__name__}: {exc}")
            if self._close_started or self.error is not None:
                return
            if not stream.connected:
                if isinstance(error, HttpStatusError) and error.status_code == 404 and self._restart:
                    self._connection_gone(error, connection_id, stream.name)
                else:
                    self._fail(error)  # it never opened: as in the reference
                return
            if isinstance(error, HttpStatusError) and not self._retry_status(error, sent_event_id is not None):
                if error.status_code == 404:
                    self._connection_gone(error, connection_id, stream.name)  # a restart replaces the stream
                    return
                if error.status_code == 409 and sent_event_id is not None:
                    error = ResumeRefusedError(error.request, 409, error.body)
                self._stream_failed(stream, error)
                return
            delay = self._retry_delay(stream, error)
            if delay is None:
                return
            if delay > 0:
                await asyncio.sleep(delay)  # the policy's backoff

    @staticmethod
    def _retry_status(error: HttpStatusError, sent_event_id: bool) -> bool:
        """Whether a retry GET's status is worth another try (else it is final)."""
        if error.status_code == 409:
            # Without Last-Event-ID, 409 means the server still holds the old response.
            return not sent_event_id
        return error.status_code in _RETRY_STATUSES

    def _retry_delay(self, stream: _Stream, error: TransportError) -> float | None:
        """Seconds before the next GET of a dropped stream, or None when the drop became fatal."""
        if self._reconnect is None:
            self._fail(error)
            return None
        if stream.last_event_id is None and not self._ledger.resume.sse:
            # No ids and no promise to replay: a new GET could silently skip events.
            self._fail(error)
            return None
        now = asyncio.get_running_loop().time()
        if stream.dropped_at is None:
            stream.dropped_at = now
        stream.attempts += 1
        elapsed = now - stream.dropped_at
        drop = StreamDrop(stream.session_id, stream.attempts, error, stream.last_event_id, elapsed, stream.name)
        delay = self._policy_delay(drop)
        if delay is None:
            if stream.attempts == 1:
                self._fail(error)  # the policy does not reconnect this one at all
            else:
                self._stream_failed(stream, ReconnectGaveUpError(stream.name, stream.attempts - 1, elapsed, error))
        return delay

    def _stream_failed(self, stream: _Stream, error: TransportError) -> None:
        """Fail with `error`; when the stream was being reconnected, tell that it gave up."""
        if stream.dropped_at is None:
            self._fail(error)
        else:
            self._give_up(stream.name, error, stream.attempts)

    async def _read_stream(self, stream: _Stream) -> None:
        assert self.connection_id is not None
        headers = {**self._headers, "Accept": EVENT_STREAM, "Acp-Connection-Id": self.connection_id}
        if stream.session_id is not None:
            headers["Acp-Session-Id"] = stream.session_id
        if stream.last_event_id:
            headers[LAST_EVENT_ID] = stream.last_event_id
        what = f"GET {stream.name}"
        timeout = httpx.Timeout(self._timeout, read=self._stream_idle_timeout)
        refused_at: float | None = None
        attempt = 0
        while True:
            request = self.http.build_request("GET", self.endpoint, headers=headers, timeout=timeout)
            try:
                async with asyncio.timeout(self._timeout):  # for the response headers only
                    response = await self.http.send(request, stream=True)
            except (TimeoutError, httpx.TimeoutException) as exc:
                raise TransportTimeoutError(f"{what}: no response headers within {self._timeout:g}s") from exc
            except httpx.HTTPError as exc:
                raise NetworkError(self.redact(f"{what}: {type(exc).__name__}: {exc}")) from exc
            if _is_2xx(response):
                break
            try:
                try:
                    async with asyncio.timeout(self._timeout):
                        body = (await response.aread()).decode(errors="replace")
                except (TimeoutError, httpx.HTTPError):
                    body = ""
                delay, refused_at = self._busy_delay(what, response, body, attempt, refused_at)
                if delay is None:
                    raise self._response_error(what, response, body)
            finally:
                await response.aclose()
            attempt += 1
            await self._wait_retry(delay)
        try:
            logger.debug("%s: HTTP %d", what, response.status_code)
            stream.connected = True
            stream.attempts = 0
            if not stream.established.done():
                stream.established.set_result(None)
            if stream.dropped_at is not None:
                stream.dropped_at = None
                self._tell(ReconnectEvent("resumed", stream.name))
            parser = SseParser(self._max_message_size)
            async for chunk in response.aiter_bytes():
                for event in parser.feed(chunk):
                    if event.has_id_field and event.id is not None:
                        position = event_position(event.id)
                        last = stream.position
                        if position is not None and last is not None and position[0] == last[0]:
                            if position[1] <= last[1]:
                                continue  # sent again after a resume: delivered already
                        stream.last_event_id = event.id
                        stream.position = position
                    if event.data:
                        self._deliver(event.data, stream.session_id)
        finally:
            await response.aclose()

    def _deliver(self, text: str, session_id: str | None) -> None:
        value, exact = received(text)
        if self._intercepted(value):
            return
        self._ledger.received(value)
        for message in protocol.frame_messages(protocol.frame_from_value(value)):
            request_id = message.get("id")
            if "method" in message:
                if request_id is not None:
                    key = protocol.id_key(request_id)
                    self._agent_request_routes.setdefault(key, collections.deque()).append(session_id)
            elif isinstance(result := message.get("result"), dict) and isinstance(result.get("sessionId"), str):
                self._open_stream(result["sessionId"])  # the session's updates flow from now on
        self._inbox.put(value, exact)

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

    async def _stop_streams(self) -> None:
        streams = list(self._streams.values())
        self._streams.clear()
        for stream in streams:
            if stream.task is not None and stream.task is not asyncio.current_task():
                stream.task.cancel()
            if not stream.established.done():
                stream.established.set_result(None)
        for stream in streams:
            if stream.task is not None and stream.task is not asyncio.current_task():
                with contextlib.suppress(BaseException):
                    await stream.task

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
        response = await self._exchange("POST", what, headers, _body(message, None))
        if not _is_2xx(response):
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

    async def _delete(self, connection_id: str) -> None:
        headers = {**self._headers, "Acp-Connection-Id": connection_id}
        self.deletes_sent += 1
        try:
            response = await self.http.request("DELETE", self.endpoint, headers=headers, timeout=self._timeout)
        except httpx.HTTPError as exc:
            logger.info("DELETE of connection %s failed: %s", connection_id, exc)
        else:
            logger.debug("DELETE of connection %s: HTTP %d", connection_id, response.status_code)

    async def _shut_down(self) -> None:
        """Finish the sends under way, DELETE the connection once, stop the streams."""
        await cancel_and_wait([self._restart_task])
        async with self._call_lane, self._response_lane:
            pass  # sends already queued go out first, in order
        if self._delete_task is not None:
            await asyncio.shield(self._delete_task)
        elif self.connection_id is not None and self.error is None:
            await self._delete(self.connection_id)
        await cancel_and_wait([stream.task for stream in self._streams.values()])
        self._inbox.end(None)
        if self._owns_client:
            await self.http.aclose()
