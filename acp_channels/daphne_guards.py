"""Twisted-level guards for daphne against hostile and slow clients.

Imported only where daphne serves (as daphne_compat installs its patches; importing Twisted
elsewhere could install the wrong reactor). Each guard fills a gap daphne and Twisted leave:

- Send backpressure (`SendGate`, `gated_handle_reply`). daphne's ASGI `send` of
  `http.response.body` and `websocket.send` writes to the Twisted transport and returns at once;
  the transport buffers without limit, so a client that stops reading grows the server without
  bound and every budget counted above the server is bypassed. Twisted transports tell their
  registered producer to pause once more than `bufferSize` (64 KiB) is unsent and to resume when
  it has all been written; the HTTP channel forwards that to the producer registered by the
  request (and keeps forwarding after daphne upgrades the connection to a WebSocket, as it stays
  the transport's producer). A `SendGate` registered there makes `send` wait after its write
  while the transport is paused; resuming wakes it, and so does a lost connection.
- Body size (`GuardedWebRequest`). Twisted reads the whole body before the request is
  processed and daphne then queues all of it for the application, so a 1 GiB POST costs more
  than 1 GiB before the view's 413. For the ACP endpoint (known from the request line once the
  headers are in) a declared Content-Length over MAX_BODY_BYTES is refused before any body is
  read, and a chunked body as soon as it passes the limit.
- Request read timeouts (`GuardedHTTPChannel`). Twisted's only timeout is an idle timeout of 12
  hours, restarted by every byte, so a client that trickles its headers (slowloris) holds a
  connection forever. HEADER_TIMEOUT_SECONDS runs from the start of a request (the connection,
  or the end of the previous response on a keep-alive connection) until its headers are in; it
  covers every request this daphne serves, WebSocket upgrades included, since the path is not
  known before the headers. BODY_TIMEOUT_SECONDS runs from the headers until the whole body is
  in, for the ACP endpoint only (other views of the site may take slow uploads). Past either:
  408. Nothing times out while a response is being written (long SSE streams are not cut).
  The clocks are deadlines that one timer per process checks every CLOCK_SWEEP_SECONDS
  (`limits.ReadClocks`), not a Twisted timer per request: two timers started and cancelled per
  POST (each also moving the asyncio timer under Twisted's asyncio reactor) cost a few percent of a
  small POST's CPU. A clock fires up to CLOCK_SWEEP_SECONDS late.
- Header size. Twisted drops a connection whose header line passes 16 KiB without a word, and
  answers a bare 400 when all headers pass 16 KiB or 500 headers; these get 431 (414 for an
  over-long request line), with a text body.

Every refusal answers with a complete `Connection: close` response. A 408 then closes; a 413,
414 or 431 (the client may still be sending) keeps reading and discarding for a few seconds, or
until the client closes, so that the client reads the answer instead of a connection reset.

HTTP/2 (daphne over TLS, h2 chosen through ALPN) is served by Twisted's H2Connection, one
H2Stream per request, with the same request class: the HTTP/1.1 channel above is only the
first protocol of the connection, and once h2 is chosen its clocks do nothing. There:

- Send backpressure works per stream and per connection. The gate is registered with the
  H2Stream, which pauses it when the client's flow-control window for the stream is used up
  (queued data counts) and resumes it on the client's WINDOW_UPDATE: a stream its client does
  not read pauses its agent, the other streams go on. But the window is the client's to choose
  (up to 2 GiB), and a client that stops reading the socket stops only the connection's writer,
  not the streams: each would queue up to its window. So every gate of the connection is also
  closed while the connection's transport is paused (`watch_h2_connections`), as over HTTP/1.1.
- Body size: a declared length over the limit is answered 413 at the headers and a body without
  one as soon as it passes the limit, by `H2BodyRefusal`: the answer is written on the stream
  (HEADERS and DATA with END_STREAM), the rest of the body is read and dropped (its window given
  back, so a client that sends all before reading gets the answer) until the client ends it, or
  for LINGER_SECONDS at most; then the stream is reset. Other streams are untouched.
- The read timeouts (408) and the 431/414 header answers do not apply: h2 frames headers itself
  (HPACK), and Twisted's connection idle timeout is the only clock. Front hostile networks with
  a proxy (docs/http2.md).
"""

from __future__ import annotations

import time
import weakref
from typing import Any, Final

from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.internet.interfaces import IPushProducer
from twisted.web import http
from zope.interface import implementer

from acp_channels import limits
from acp_channels.conf import acp_settings
from acp_channels.handoff import LazyEvent

# Twisted's HTTP classes are mostly untyped: subclassed and called through Any.
HTTPChannel: Any = http.HTTPChannel
GenericHTTPChannelProtocol: Any = http._GenericHTTPChannelProtocol

#: How long a refused connection keeps reading (and discarding) before it is cut.
LINGER_SECONDS: Final = 5.0


# -- send backpressure -----------------------------------------------------------------------


@implementer(IPushProducer)
class SendGate:
    """A push producer registered with an HTTP channel: closed while the transport holds more
    than its buffer size unsent, open again once it has written everything, or the connection
    is gone (so nobody waits on a dead socket). Over HTTP/2 it is registered with the stream
    (closed while the stream's window is used up) and also closed while the connection's
    transport is paused: open only when neither holds it."""

    def __init__(self) -> None:
        self._open = LazyEvent()
        self._open.set()
        self._held_by: set[str] = set()
        self.stopped = False

    def hold(self, reason: str) -> None:
        if not self.stopped:
            self._held_by.add(reason)
            self._open.clear()

    def release(self, reason: str) -> None:
        self._held_by.discard(reason)
        if not self._held_by:
            self._open.set()

    def pauseProducing(self) -> None:
        self.hold("consumer")

    def resumeProducing(self) -> None:
        self.release("consumer")

    def stopProducing(self) -> None:
        self.stopped = True
        self._held_by.clear()
        self._open.set()

    @property
    def writable(self) -> bool:
        """Open now: a writer need not wait (checked first, so the common case awaits nothing)."""
        return self._open.is_set()

    async def wait_writable(self) -> None:
        await self._open.wait()


def gate_before_write(protocol: Any, message: dict[str, Any]) -> SendGate | None:
    """The gate a `send` of `message` must wait on after writing it, registered before the write
    so the write's own pause is seen. The last body message unregisters it (Twisted expects a
    request's producer to be gone before the request finishes)."""
    kind = message.get("type")
    if kind == "http.response.body":
        return _response_gate(protocol, more_body=bool(message.get("more_body", False)))
    if kind == "websocket.send":
        return _websocket_gate(protocol)
    return None


def _response_gate(request: Any, *, more_body: bool) -> SendGate | None:
    gate: SendGate | None = getattr(request, "acp_send_gate", None)
    if not more_body:
        if gate is not None:
            request.acp_send_gate = None
            gate.stopProducing()
            if request.producer is gate and request.channel is not None:
                request.unregisterProducer()
        return None
    if gate is None:
        if request.channel is None or request.finished or request.producer is not None:
            return None
        gate = request.acp_send_gate = SendGate()
        request.registerProducer(gate, True)
        connection = h2_connection_of(request.channel)
        if connection is not None:
            _watch_h2_gate(connection, gate)
    return gate


# -- HTTP/2 ----------------------------------------------------------------------------------


def h2_connection_of(channel: Any) -> Any:
    """The H2Connection of a request's channel when it is an HTTP/2 stream (Twisted's H2Stream:
    a `streamID` and its connection), else None."""
    connection = getattr(channel, "_conn", None)
    if connection is None or not isinstance(getattr(channel, "streamID", None), int):
        return None
    return connection


def _watch_h2_gate(connection: Any, gate: SendGate) -> None:
    gates: weakref.WeakSet[SendGate] | None = getattr(connection, "acp_send_gates", None)
    if gates is None:
        gates = connection.acp_send_gates = weakref.WeakSet()
    gates.add(gate)
    if getattr(connection, "_consumerBlocked", None) is not None:
        gate.hold("connection")  # the transport is paused right now


def watch_h2_connections(h2_connection_class: Any) -> None:
    """Close every send gate of an HTTP/2 connection while its transport is paused (the client
    does not read the socket), open them again when it resumes. Wraps Twisted's
    H2Connection.pauseProducing/resumeProducing, which the transport calls."""
    if getattr(h2_connection_class, "acp_gates_watched", False):
        return
    pause, resume = h2_connection_class.pauseProducing, h2_connection_class.resumeProducing

    def pause_producing(self: Any) -> None:
        pause(self)
        for gate in list(getattr(self, "acp_send_gates", ())):
            gate.hold("connection")

    def resume_producing(self: Any) -> None:
        resume(self)
        for gate in list(getattr(self, "acp_send_gates", ())):
            gate.release("connection")

    h2_connection_class.pauseProducing = pause_producing
    h2_connection_class.resumeProducing = resume_producing
    h2_connection_class.acp_gates_watched = True


class H2BodyRefusal:
    """A 413 for one HTTP/2 stream whose body is over the limit (see the module docstring): the
    answer goes out on the stream while the stream stays known to Twisted, so the rest of the
    client's body is read and dropped (its window given back) until the client ends it or
    LINGER_SECONDS pass; then the stream is forgotten (reset if the client is still sending)."""

    def __init__(self, stream: Any, status: int, text: str) -> None:
        self.stream = stream
        self.connection = stream._conn
        self.status = status
        self.body = text.encode()
        self.answered = False
        self.client_done = False
        self._linger: Any = None
        # The stream joins the connection's table only after its headers are parsed (our
        # gotLength runs during that): answer on the next turn of the reactor.
        self.connection._reactor.callLater(0, self._answer)

    def _active(self) -> bool:
        connection = self.connection
        return bool(connection._stillProducing) and bool(connection._streamIsActive(self.stream.streamID))

    def _answer(self) -> None:
        if not self._active():
            return
        import h2.exceptions

        stream_id = self.stream.streamID
        h2_state = self.connection.conn
        headers = [
            (b":status", str(self.status).encode()),
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(self.body)).encode()),
        ]
        try:
            h2_state.send_headers(stream_id, headers)
            h2_state.send_data(stream_id, self.body, end_stream=True)
        except h2.exceptions.H2Error:  # no window for the answer, or the stream closed meanwhile
            self._forget(reset=True)
            return
        self.answered = True
        self.connection._tryToWriteControlData()
        if self.client_done:
            self._forget(reset=False)
        else:
            self._linger = self.connection._reactor.callLater(LINGER_SECONDS, self._forget, True)

    def body_ended(self) -> None:
        """The client ended its body (Twisted's requestReceived)."""
        self.client_done = True
        if self.answered:
            self._forget(reset=False)

    def _forget(self, reset: bool) -> None:
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        self._linger = None
        if not self._active():
            return
        if reset:
            self.connection.abortRequest(self.stream.streamID)  # RST_STREAM, and forgotten
        else:
            self.connection._requestDone(self.stream.streamID)


def _websocket_gate(protocol: Any) -> SendGate | None:
    gate: SendGate | None = getattr(protocol, "acp_send_gate", None)
    if gate is None:
        channel = _upgraded_channel(getattr(protocol, "transport", None))
        if channel is None or channel._requestProducer is not None:
            return None
        gate = protocol.acp_send_gate = SendGate()
        channel.registerProducer(gate, True)
    return gate


def _upgraded_channel(transport: Any) -> Any:
    """The HTTP channel a WebSocket was upgraded from: still the transport's producer (directly
    over TCP, through the TLS wrapper's producer membrane over TLS)."""
    producer = getattr(transport, "producer", None)
    if not isinstance(producer, HTTPChannel):
        producer = getattr(getattr(transport, "_producer", None), "_producer", None)
    return producer if isinstance(producer, HTTPChannel) else None


# -- request reading: timeouts, header sizes, body size --------------------------------------


class GuardedHTTPChannel(HTTPChannel):  # type: ignore[misc]
    """Twisted's HTTP/1.1 channel with request read timeouts, 431 for oversized headers, and a
    graceful refusal the request can use (413)."""

    #: The running read clock: its deadline (time.monotonic) and the 408's text; none: inf.
    clock_deadline = float("inf")
    _clock_text = ""
    _linger: Any = None
    #: Whether any byte of the next request arrived since the header clock started.
    _request_begun = False
    #: Whether a request was read whole on this connection (it is a keep-alive connection now).
    served_a_request = False
    refused = False

    def connectionMade(self) -> None:
        super().connectionMade()
        self._start_header_clock()

    def dataReceived(self, data: bytes) -> None:
        if self.refused:
            return  # lingering after a refusal: discard
        self._request_begun = True
        super().dataReceived(data)

    def lineReceived(self, line: bytes) -> None:
        if self.refused:
            return
        if self._receivedHeaderSize + len(line) > self.totalHeadersSize:
            self.refuse(431, "Request Header Fields Too Large", limits.HEADERS_TOO_LARGE)
            return
        super().lineReceived(line)

    def lineLengthExceeded(self, line: bytes) -> None:
        if hasattr(self, "_command"):  # the request line is in: a header line is too long
            self.refuse(431, "Request Header Fields Too Large", limits.HEADERS_TOO_LARGE)
        else:
            self.refuse(414, "URI Too Long", limits.REQUEST_LINE_TOO_LONG)

    def headerReceived(self, line: bytes) -> bool:
        if self.refused:
            return False
        if self._receivedHeaderCount >= self.maxHeaders:
            self.refuse(431, "Request Header Fields Too Large", limits.HEADERS_TOO_LARGE)
            return False
        return bool(super().headerReceived(line))

    def allHeadersReceived(self) -> None:
        self._stop_clock()
        super().allHeadersReceived()
        if self.length != 0 and not self.refused and limits.is_acp_target(self.request_target):
            self._start_clock(float(acp_settings.BODY_TIMEOUT_SECONDS), limits.BODY_TIMEOUT)

    def rawDataReceived(self, data: bytes) -> None:
        if not self.refused:
            super().rawDataReceived(data)

    def allContentReceived(self) -> None:
        self._stop_clock()
        if not self.refused:
            super().allContentReceived()

    def requestDone(self, request: Any) -> None:
        # Started before the buffered next request (if any) is parsed, which may stop it again.
        if self.persistent:
            self._start_header_clock()
        super().requestDone(request)

    def connectionLost(self, reason: Any) -> None:
        self._stop_clock()
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        self._linger = None
        super().connectionLost(reason)

    @property
    def request_target(self) -> bytes:
        """The request-target of the request being read (known once its request line is in)."""
        target: bytes = getattr(self, "_path", b"")
        return target

    def refuse(self, status: int, reason: str, text: str, *, linger: bool = True) -> None:
        """Answer a request that is still being read, then close. With `linger` (the client may
        still be sending), keep reading and discarding for LINGER_SECONDS before cutting the
        connection, so the client gets to read the answer rather than a reset: closing with
        unread data resets, and a half-close would make naive TCP proxies close both ways."""
        if self.refused or self.transport is None:
            return
        self.refused = True
        self._stop_clock()
        self.transport.write(limits.plain_text_response(status, reason, text))
        if not linger:
            self.loseConnection()
        # Lingering, or flushing to a client that does not read: either way, not forever.
        self._linger = self.callLater(LINGER_SECONDS, self.transport.abortConnection)

    def _start_header_clock(self) -> None:
        self._request_begun = False
        self._start_clock(float(acp_settings.HEADER_TIMEOUT_SECONDS), limits.HEADERS_TIMEOUT)

    def _start_clock(self, timeout: float, text: str) -> None:
        self.clock_deadline = time.monotonic() + timeout
        self._clock_text = text
        limits.read_clocks.start(self, self.callLater)

    def _stop_clock(self) -> None:
        if self.clock_deadline != float("inf"):
            self.clock_deadline = float("inf")
            limits.read_clocks.stop(self)

    def clock_expired(self) -> None:
        """The running read clock ran out (`ReadClocks` has forgotten it already)."""
        self.clock_deadline = float("inf")
        self._timed_out(self._clock_text)

    def _timed_out(self, text: str) -> None:
        transport = self.transport
        if transport is None or transport.disconnecting or getattr(transport, "negotiatedProtocol", None) == b"h2":
            return  # closing already, or handed over to HTTP/2
        if text is limits.HEADERS_TIMEOUT and self.served_a_request and not self._request_begun:
            # An idle keep-alive connection: close it quietly (a 408 could cross a request the
            # client is sending right now); a fresh connection that sent nothing gets the 408.
            self.loseConnection()
            return
        self.refuse(408, "Request Timeout", text, linger=False)


class GuardedWebRequest(WebRequest):  # type: ignore[misc]
    """daphne's request with the ACP endpoint's body limit applied while the body arrives."""

    acp_body_limit: int | None = None
    acp_body_size = 0
    acp_send_gate: SendGate | None = None
    #: Over HTTP/2: the 413 under way for this stream (its body is being dropped).
    acp_h2_refusal: H2BodyRefusal | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Twisted parses POSTed form bodies into request.args, which daphne never reads (the
        # application gets the raw body): the Content-Type parse alone (email.message) cost 5%
        # of a POST, and a malformed multipart body was answered 400 by Twisted itself.
        self._parsePOSTFormSubmission = False

    def gotLength(self, length: int | None) -> None:
        channel = self.channel
        if isinstance(channel, GuardedHTTPChannel) and limits.is_acp_target(channel.request_target):
            self.acp_body_limit = int(acp_settings.MAX_BODY_BYTES)
            if length is not None and length > self.acp_body_limit:
                # Refused before any body is read; no `100 Continue` may follow the answer.
                self.requestHeaders.removeHeader(b"Expect")
                channel.refuse(413, "Content Too Large", limits.BODY_TOO_LARGE)
                return
        elif h2_connection_of(channel) is not None and limits.is_acp_target(channel.path or b""):
            # HTTP/2: the pseudo-headers (:path) come before every other header, so the target
            # is known whenever the length is.
            self.acp_body_limit = int(acp_settings.MAX_BODY_BYTES)
            if length is not None and length > self.acp_body_limit:
                self.requestHeaders.removeHeader(b"Expect")
                self._refuse_h2()
                super().gotLength(0)  # a small buffer, never written
                return
        super().gotLength(length)

    def _refuse_h2(self) -> None:
        if self.acp_h2_refusal is None:
            self.acp_h2_refusal = H2BodyRefusal(self.channel, 413, limits.BODY_TOO_LARGE)

    def handleContentChunk(self, data: bytes) -> None:
        channel = self.channel
        if (isinstance(channel, GuardedHTTPChannel) and channel.refused) or self.acp_h2_refusal is not None:
            return
        if self.acp_body_limit is not None:
            self.acp_body_size += len(data)
            if self.acp_body_size > self.acp_body_limit:
                if isinstance(channel, GuardedHTTPChannel):
                    channel.refuse(413, "Content Too Large", limits.BODY_TOO_LARGE)
                elif h2_connection_of(channel) is not None:
                    self._refuse_h2()
                return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        channel = self.channel
        if isinstance(channel, GuardedHTTPChannel):
            if channel.refused:
                return
            channel.served_a_request = True
        if self.acp_h2_refusal is not None:
            self.acp_h2_refusal.body_ended()  # answered 413: the application never sees it
            return
        super().requestReceived(command, path, version)

    def connectionLost(self, reason: Any) -> None:
        if self.acp_send_gate is not None:
            self.acp_send_gate.stopProducing()
        super().connectionLost(reason)


def guarded_channel_protocol(factory: Any) -> Any:
    """What daphne's HTTPFactory builds per connection: Twisted's protocol switcher around our
    channel (in place of twisted.web.http._genericHTTPChannelProtocolFactory)."""
    return GenericHTTPChannelProtocol(GuardedHTTPChannel())


class GuardedHTTPFactory(HTTPFactory):  # type: ignore[misc]
    """daphne's HTTP factory, building guarded channels that create guarded requests."""

    protocol = guarded_channel_protocol

    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = GuardedWebRequest
        return protocol
