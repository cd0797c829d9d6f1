"""An httpx transport whose HTTP/2 connections do not stall long-lived streams.

httpcore (httpx's engine) reads an HTTP/2 connection from whichever request is waiting for its
own events: under a lock, one waiter at a time blocks on the socket and files what arrives under
each stream. A waiter whose events were filed while it queued for the lock must still wait for
the lock, and the waiter ahead of it, having nothing of its own yet, blocks on the socket with
the lock held. With SSE streams that stay open, that next read is whatever comes next on the
connection: a keep-alive comment 15 s later. So over one HTTP/2 connection, a POST's answer or a
session's event sat for up to 15 s (50 session streams: every few calls).

Here a waiter never queues behind a blocked read: it takes its events as soon as they are filed.
One waiter reads the socket at a time; the others wait for that read to end (each with its own
read timeout) and look again.

And a connection takes no more requests than the server allows streams at once (its SETTINGS
MAX_CONCURRENT_STREAMS; 100 on daphne and hypercorn): httpcore would queue the next request on
that connection until a stream ends, and SSE streams do not end, so the 100th session of a
connection waited forever. Here such a request goes to another connection of the pool.

The connection class is swapped in when httpcore creates it, so nothing else of httpcore
changes, and only connections made by this transport are affected. If httpcore's internals are
not what this expects (another version), its own classes are used.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import httpcore
import httpx

_StockHTTP2: type[Any] | None
try:  # httpcore's HTTP/2 connection needs h2: without it there is nothing to fix
    from httpcore._async.http2 import AsyncHTTP2Connection as _StockHTTP2
except ImportError:  # pragma: no cover - the http2 extra is not installed
    _StockHTTP2 = None


def _compatible() -> bool:
    AsyncHTTP2Connection = _StockHTTP2
    return (
        AsyncHTTP2Connection is not None
        and hasattr(AsyncHTTP2Connection, "_receive_events")
        and hasattr(AsyncHTTP2Connection, "_read_incoming_data")
        and hasattr(AsyncHTTP2Connection, "_write_outgoing_data")
        and hasattr(httpcore, "AsyncHTTPConnection")
    )


if _compatible():
    import h2.events

    _FILED_EVENTS = (h2.events.ResponseReceived, h2.events.DataReceived, h2.events.StreamEnded, h2.events.StreamReset)

    class _FairHTTP2Connection(_StockHTTP2):  # type: ignore[misc,valid-type]
        """httpcore's HTTP/2 connection, read by one waiter at a time without holding the others."""

        _acp_reading = False
        _acp_read_done: asyncio.Event | None = None
        #: Requests holding (or about to hold) one of the connection's streams.
        _acp_streams = 0
        _acp_closed_in: weakref.WeakSet[asyncio.Task[Any]] | None = None

        def is_available(self) -> bool:
            return bool(super().is_available()) and self._acp_streams < self._acp_stream_limit()

        def _acp_stream_limit(self) -> int:
            # httpcore's own count: 1 until the server's SETTINGS came, then their value.
            return int(getattr(self, "_max_streams", 1)) if self._sent_connection_init else 1 << 30

        async def handle_async_request(self, request: Any) -> Any:
            if self._acp_streams >= self._acp_stream_limit():
                raise httpcore.ConnectionNotAvailable()  # the pool sends it on another connection
            self._acp_streams += 1
            if self._acp_closed_in is None:
                self._acp_closed_in = weakref.WeakSet()
            task = asyncio.current_task()
            try:
                return await super().handle_async_request(request)
            except BaseException:
                if task not in self._acp_closed_in:
                    self._acp_streams -= 1  # failed before it had a stream to close
                raise
            finally:
                if task is not None:
                    self._acp_closed_in.discard(task)

        async def _response_closed(self, stream_id: int) -> None:
            self._acp_streams -= 1
            if self._acp_closed_in is not None and (task := asyncio.current_task()) is not None:
                self._acp_closed_in.add(task)
            await super()._response_closed(stream_id)

        async def _receive_events(self, request: Any, stream_id: int | None = None) -> None:
            while self._acp_reading:
                if stream_id is not None and self._events.get(stream_id):
                    break  # filed by the current reader: take them now
                done = self._acp_read_done
                assert done is not None
                timeout = request.extensions.get("timeout", {}).get("read")
                try:
                    await asyncio.wait_for(done.wait(), timeout)
                except TimeoutError as exc:
                    raise httpcore.ReadTimeout(f"no data within {timeout}s") from exc
                if stream_id is None:
                    break  # waiting for flow control: the caller looks at its window again
            else:
                self._raise_if_terminated(stream_id)
                if stream_id is None or not self._events.get(stream_id):
                    await self._read_once(request)
            await self._write_outgoing_data(request)

        def _raise_if_terminated(self, stream_id: int | None) -> None:
            terminated = self._connection_terminated
            if terminated is None:
                return
            if stream_id and terminated.last_stream_id and stream_id > terminated.last_stream_id:
                self._request_count -= 1
                raise httpcore.ConnectionNotAvailable()
            raise httpcore.RemoteProtocolError(terminated)

        async def _read_once(self, request: Any) -> None:
            self._acp_reading = True
            self._acp_read_done = asyncio.Event()
            try:
                for event in await self._read_incoming_data(request):
                    if isinstance(event, h2.events.RemoteSettingsChanged):
                        await self._receive_remote_settings_change(event)
                    elif isinstance(event, _FILED_EVENTS):
                        if event.stream_id in self._events:
                            self._events[event.stream_id].append(event)
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        self._connection_terminated = event
            finally:
                self._acp_reading = False
                self._acp_read_done.set()  # the waiters look again (and one of them reads next)

    class _Connection(httpcore.AsyncHTTPConnection):
        """httpcore's connection, whose HTTP/2 connection (once made) is the fair one."""

        @property
        def _connection(self) -> Any:
            return self.__dict__.get("_acp_connection")

        @_connection.setter
        def _connection(self, value: Any) -> None:
            if type(value) is _StockHTTP2:
                value.__class__ = _FairHTTP2Connection
            self.__dict__["_acp_connection"] = value

    class _Pool(httpcore.AsyncConnectionPool):
        def create_connection(self, origin: Any) -> Any:
            connection = super().create_connection(origin)
            if type(connection) is httpcore.AsyncHTTPConnection:
                connection.__class__ = _Connection
                connection.__dict__["_acp_connection"] = connection.__dict__.pop("_connection", None)
            return connection


def fair_h2_transport(**options: Any) -> httpx.AsyncHTTPTransport:
    """`httpx.AsyncHTTPTransport(**options)` whose HTTP/2 connections read fairly (see above)."""
    transport = httpx.AsyncHTTPTransport(**options)
    pool = getattr(transport, "_pool", None)
    if _compatible() and type(pool) is httpcore.AsyncConnectionPool:
        pool.__class__ = _Pool
    return transport


def is_fair(transport: httpx.AsyncBaseTransport) -> bool:
    """Whether `transport`'s HTTP/2 connections are the fair ones."""
    return _compatible() and type(getattr(transport, "_pool", None)).__name__ == "_Pool"
