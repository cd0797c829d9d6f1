"""ACP over HTTP: POSTs in, Server-Sent Events out (the reference client's contract, rust-reference §13).

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

Reconnecting a dropped stream is left to a `ReconnectPolicy` (none by default, as in the
reference): it gets a `StreamDrop` and returns a delay to retry after, or None to give up. The
retry GET carries `Last-Event-ID` when the stream had event ids.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias, TypeVar

import httpx

from acp_channels import protocol
from acp_channels.protocol import CONNECTION_HEADER, Batch, Frame, Malformed, Single

from ._base import FrameValue, TransportBase, frame_value_for_send, received
from .errors import (
    ClientUsageError,
    HttpStatusError,
    NetworkError,
    ProtocolViolationError,
    StreamEndedError,
    TransportClosedError,
    TransportError,
    TransportTimeoutError,
)
from .sse import SseParser, SseTooLarge

__all__ = ["HttpTransport", "ReconnectPolicy", "StreamDrop"]

logger = logging.getLogger("acp_channels.client")

T = TypeVar("T")

JSON: Final = "application/json"
EVENT_STREAM: Final = "text/event-stream"
LAST_EVENT_ID: Final = "Last-Event-ID"
_ERROR_BODY_LIMIT: Final = 2000


@dataclass(frozen=True, slots=True)
class StreamDrop:
    """An SSE stream that was established has ended or broken."""

    session_id: str | None
    """The session of the stream; None for the connection stream."""
    attempt: int
    """1 for the first retry since the stream was last (re)established."""
    error: TransportError
    """Why it ended (StreamEndedError, NetworkError, HttpStatusError of a failed retry, …)."""
    last_event_id: str | None
    """The last SSE `id:` seen on it; the retry sends it as `Last-Event-ID`."""


#: Decides whether to reopen a dropped stream: seconds to wait before the retry GET, or None to
#: give up (the drop is then fatal, as in the reference client).
ReconnectPolicy: TypeAlias = Callable[[StreamDrop], float | None]


@dataclass(eq=False)
class _Stream:
    session_id: str | None
    established: asyncio.Future[None]
    task: asyncio.Task[None] | None = None
    last_event_id: str | None = None
    attempts: int = 0
    connected: bool = False

    @property
    def name(self) -> str:
        return "connection stream" if self.session_id is None else f"session stream {self.session_id!r}"


def _is_2xx(response: httpx.Response) -> bool:
    return 200 <= response.status_code < 300


def _same_id(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _response_only(value: FrameValue) -> bool:
    """A single response-shaped object, or a batch of nothing else (rust-reference §4.1)."""
    if isinstance(value, dict):
        return protocol.is_response_shaped(value)
    return all(protocol.is_response_shaped(entry) for entry in value)


def _messages(frame: Frame) -> list[protocol.Message]:
    return protocol.frame_messages(frame)


def _body(value: FrameValue, raw: str | None) -> bytes:
    """The POST body: the caller's exact text when it gave one (a relay), else `value` as JSON."""
    return (raw if raw is not None else protocol.dumps(value)).encode()


class HttpTransport(TransportBase):
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
        max_message_size: int = 64 * 1024 * 1024,
        secrets: Iterable[str] = (),
    ) -> None:
        super().__init__(endpoint, headers, timeout, max_message_size, secrets=secrets)
        self._stream_idle_timeout = stream_idle_timeout
        self._reconnect = reconnect
        self._owns_client = http_client is None
        if http_client is None:
            http_client = httpx.AsyncClient(
                cookies=cookies,
                timeout=httpx.Timeout(timeout),
                # Every open stream holds a connection: no cap, or many sessions would deadlock.
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=20),
                headers={"User-Agent": "acp-channels-client"},
            )
        elif cookies is not None:
            http_client.cookies.update(cookies)
        self.http = http_client
        self._call_lane = asyncio.Lock()
        self._response_lane = asyncio.Lock()
        self._initialized = False
        self._initializing = False
        self._streams: dict[str | None, _Stream] = {}
        self._agent_request_routes: dict[str, collections.deque[str | None]] = {}
        self._closing = asyncio.Event()
        self._close_done = asyncio.Event()
        self._delete_task: asyncio.Task[None] | None = None
        self.deletes_sent = 0

    @property
    def cookies(self) -> httpx.Cookies:
        return self.http.cookies

    def stream_event_id(self, session_id: str | None = None) -> str | None:
        """The last SSE event id seen on a stream (None: no such stream or no ids)."""
        stream = self._streams.get(session_id)
        return stream.last_event_id if stream else None

    # ------------------------------------------------------------------------------- receiving

    # --------------------------------------------------------------------------------- sending

    async def connect(self) -> None:
        """Nothing to do before the first POST (kept for symmetry with the WebSocket transport)."""
        self._raise_if_unusable()

    async def send(self, frame: Any, *, raw: str | None = None) -> None:
        value = frame_value_for_send(frame)
        self._raise_if_unusable()
        parsed = protocol.frame_from_value(value)
        if _response_only(value):
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
            await self._post(value, headers, self._describe(parsed), raw)

    def _sessions_of(self, frame: Frame) -> list[str]:
        """Session ids the frame names, checking session methods have one (before any effect)."""
        sessions: list[str] = []
        for message in _messages(frame):
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
        headers = self._post_headers()
        if isinstance(value, dict) and "id" in value:
            routes = self._agent_request_routes.get(protocol.id_key(value["id"]))
            if routes:
                route = routes.popleft()
                if not routes:
                    del self._agent_request_routes[protocol.id_key(value["id"])]
                if route is not None:
                    headers["Acp-Session-Id"] = route
        async with self._response_lane:
            self._raise_if_failed()
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
            raise self._fail(self._response_error(what, response, response.text))
        return response

    def _response_error(self, what: str, response: httpx.Response, body: str) -> HttpStatusError:
        challenge = response.headers.get("www-authenticate")
        return self._status_error(what, response.status_code, body[:_ERROR_BODY_LIMIT], challenge)

    async def _exchange(
        self, method: str, what: str, headers: dict[str, str], content: bytes | None = None
    ) -> httpx.Response:
        """One request/response, read whole; a timeout or network failure is fatal."""
        request = self.http.request(method, self.endpoint, headers=headers, content=content, timeout=self._timeout)
        try:
            return await self._unless_failed(request)
        except httpx.TimeoutException as exc:
            raise self._fail(TransportTimeoutError(f"{what}: no answer within {self._timeout:g}s")) from exc
        except httpx.HTTPError as exc:
            raise self._fail(NetworkError(self.redact(f"{what}: {type(exc).__name__}: {exc}"))) from exc

    # ------------------------------------------------------------------------------ initialize

    async def _initialize(self, value: FrameValue, raw: str | None) -> None:
        assert isinstance(value, dict)
        self._initializing = True
        try:
            headers = {**self._headers, "Content-Type": JSON, "Accept": JSON}
            response = await self._exchange("POST", "initialize", headers, _body(value, raw))
            logger.debug("POST initialize: HTTP %d", response.status_code)
            connection_id = protocol.header_value(response.headers.get_list(CONNECTION_HEADER)) or None
            if connection_id is not None:
                self.connection_id = connection_id  # kept even on failure, so it is deleted
            if not _is_2xx(response):
                raise self._fail(self._response_error("initialize", response, response.text))
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
            self._inbox.put(reply, response.text)
            await self._wait_established(None)
        finally:
            self._initializing = False

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
        stream = self._open_stream(session_id)
        if stream is None:
            raise self._closed_error()
        if not stream.established.done():
            await self._unless_failed(asyncio.shield(stream.established), self._closing)

    async def _run_stream(self, stream: _Stream) -> None:
        while True:
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
            if stream.connected and self._reconnect is not None:
                stream.attempts += 1
                drop = StreamDrop(stream.session_id, stream.attempts, error, stream.last_event_id)
                delay = self._reconnect(drop)
                if delay is not None:
                    logger.info("reopening %s (attempt %d): %s", stream.name, stream.attempts, error)
                    if delay > 0:
                        await asyncio.sleep(delay)  # the policy's backoff
                    continue
            self._fail(error)
            return

    async def _read_stream(self, stream: _Stream) -> None:
        assert self.connection_id is not None
        headers = {**self._headers, "Accept": EVENT_STREAM, "Acp-Connection-Id": self.connection_id}
        if stream.session_id is not None:
            headers["Acp-Session-Id"] = stream.session_id
        if stream.last_event_id is not None:
            headers[LAST_EVENT_ID] = stream.last_event_id
        what = f"GET {stream.name}"
        timeout = httpx.Timeout(self._timeout, read=self._stream_idle_timeout)
        request = self.http.build_request("GET", self.endpoint, headers=headers, timeout=timeout)
        try:
            async with asyncio.timeout(self._timeout):  # for the response headers only
                response = await self.http.send(request, stream=True)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise TransportTimeoutError(f"{what}: no response headers within {self._timeout:g}s") from exc
        except httpx.HTTPError as exc:
            raise NetworkError(self.redact(f"{what}: {type(exc).__name__}: {exc}")) from exc
        try:
            if not _is_2xx(response):
                try:
                    async with asyncio.timeout(self._timeout):
                        body = (await response.aread()).decode(errors="replace")
                except (TimeoutError, httpx.HTTPError):
                    body = ""
                raise self._response_error(what, response, body)
            logger.debug("%s: HTTP %d", what, response.status_code)
            stream.connected = True
            stream.attempts = 0
            if not stream.established.done():
                stream.established.set_result(None)
            parser = SseParser(self._max_message_size)
            async for chunk in response.aiter_bytes():
                for event in parser.feed(chunk):
                    if event.id is not None:
                        stream.last_event_id = event.id
                    if event.data:
                        self._deliver(event.data, stream.session_id)
        finally:
            await response.aclose()

    def _deliver(self, text: str, session_id: str | None) -> None:
        value, exact = received(text)
        for message in _messages(protocol.frame_from_value(value)):
            request_id = message.get("id")
            if "method" in message:
                if request_id is not None:
                    key = protocol.id_key(request_id)
                    self._agent_request_routes.setdefault(key, collections.deque()).append(session_id)
            elif isinstance(result := message.get("result"), dict) and isinstance(result.get("sessionId"), str):
                self._open_stream(result["sessionId"])  # the session's updates flow from now on
        self._inbox.put(value, exact)

    # ------------------------------------------------------------------------------- the end

    def _raise_if_unusable(self) -> None:
        self._raise_if_failed()
        if self._close_started:
            raise TransportClosedError("transport is closed")

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self._closed_error()

    def _fail(self, error: TransportError) -> TransportError:
        """Make `error` the end of the transport (first one wins); returns it for raising."""
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

    async def close(self) -> None:
        """Finish the sends under way, DELETE the connection once, stop the streams."""
        if self._close_started:
            await self._close_done.wait()
            return
        self._close_started = True
        self._closing.set()
        try:
            async with self._call_lane, self._response_lane:
                pass  # sends already queued go out first, in order
            if self._delete_task is not None:
                await asyncio.shield(self._delete_task)
            elif self.connection_id is not None and self.error is None:
                await self._delete(self.connection_id)
            for stream in self._streams.values():
                if stream.task is not None:
                    stream.task.cancel()
            for stream in list(self._streams.values()):
                if stream.task is not None:
                    with contextlib.suppress(BaseException):
                        await stream.task
            self._inbox.end(None)
            if self._owns_client:
                await self.http.aclose()
        finally:
            self._close_done.set()
