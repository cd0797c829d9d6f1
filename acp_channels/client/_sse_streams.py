"""The HTTP transport's Server-Sent Events streams: the connection stream (GET, no session
header) and one stream per session. Each is read on its own task; its events are delivered in
order, and the agent's requests remembered with the stream that carried them (their answers
name its session). A stream that drops is reopened when that loses nothing (docs/resumable-streams.md):
the retry GET carries `Last-Event-ID`, and events the server sends again are skipped."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Final

import httpx

from acp_channels import _protocol as protocol

from ._base import received
from ._errors import (
    HttpStatusError,
    NetworkError,
    ProtocolViolationError,
    ReconnectGaveUpError,
    ResumeRefusedError,
    StreamEndedError,
    TransportError,
    TransportTimeoutError,
)
from ._http_requests import HttpRequests, is_2xx
from ._reconnect import ReconnectEvent, StreamDrop
from ._sse import SseParser, SseTooLarge

__all__ = ["SseStreams", "event_position"]

logger = logging.getLogger("acp_channels.client")

EVENT_STREAM: Final = "text/event-stream"
LAST_EVENT_ID: Final = "Last-Event-ID"
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


class SseStreams(HttpRequests):
    """The streams of one connection (HttpTransport sets the attributes below)."""

    _stream_idle_timeout: float | None
    #: The open streams by session id (None: the connection stream).
    _streams: dict[str | None, _Stream]
    #: For each agent request id, the sessions whose streams carried it (None: the connection's).
    _agent_request_routes: dict[str, collections.deque[str | None]]

    def stream_event_id(self, session_id: str | None = None) -> str | None:
        """The last SSE event id seen on a stream (None: no such stream or no ids)."""
        stream = self._streams.get(session_id)
        return stream.last_event_id if stream else None

    def _session_of_request(self, request_id: Any) -> str | None:
        """The session whose stream carried the agent's request `request_id`, for the header of
        its answer (None: the connection stream, or not an agent request); each answer takes one."""
        key = protocol.id_key(request_id)
        routes = self._agent_request_routes.get(key)
        if not routes:
            return None
        route = routes.popleft()
        if not routes:
            del self._agent_request_routes[key]
        return route

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
            if self._ledger.terminated:
                # The attached session's connection ended: its streams end, nothing to resume.
                self._fail(StreamEndedError(stream.session_id, "the session was terminated (its connection ended)"))
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
        token_retried = False
        while True:
            sent_headers, token = await self._authorized(headers)  # every open and resume: the current token
            request = self.http.build_request("GET", self.endpoint, headers=sent_headers, timeout=timeout)
            try:
                async with asyncio.timeout(self._timeout):  # for the response headers only
                    response = await self.http.send(request, stream=True)
            except (TimeoutError, httpx.TimeoutException) as exc:
                raise TransportTimeoutError(f"{what}: no response headers within {self._timeout:g}s") from exc
            except httpx.HTTPError as exc:
                raise NetworkError(self.redact(f"{what}: {type(exc).__name__}: {exc}")) from exc
            if is_2xx(response):
                break
            try:
                try:
                    async with asyncio.timeout(self._timeout):
                        body = (await response.aread()).decode(errors="replace")
                except (TimeoutError, httpx.HTTPError):
                    body = ""
                challenge = response.headers.get("www-authenticate")
                if not token_retried and await self._token_replaced(response.status_code, challenge, token):
                    token_retried = True
                    logger.info("%s: HTTP 401 invalid_token; opening it again with the refreshed token", what)
                    continue
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
