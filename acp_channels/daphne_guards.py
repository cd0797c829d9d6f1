"""Twisted-level guards for daphne against hostile and slow clients.

Imported only by `daphne_compat.install()` in a daphne process (importing Twisted anywhere else
could install the wrong reactor). Each guard exists because daphne and Twisted leave a gap:

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
- Header size. Twisted drops a connection whose header line passes 16 KiB without a word, and
  answers a bare 400 when all headers pass 16 KiB or 500 headers; these get 431 (414 for an
  over-long request line), with a text body.

Every refusal answers with a complete `Connection: close` response. A 408 then closes; a 413,
414 or 431 (the client may still be sending) keeps reading and discarding for a few seconds, or
until the client closes, so that the client reads the answer instead of a connection reset.
HTTP/2 (daphne over TLS with h2) is served by Twisted's H2Connection: only the send gate applies
there.
"""

from __future__ import annotations

from functools import partial
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
    is gone (so nobody waits on a dead socket)."""

    def __init__(self) -> None:
        self._open = LazyEvent()
        self._open.set()
        self.stopped = False

    def pauseProducing(self) -> None:
        if not self.stopped:
            self._open.clear()

    def resumeProducing(self) -> None:
        self._open.set()

    def stopProducing(self) -> None:
        self.stopped = True
        self._open.set()

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
    return gate


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

    _header_clock: Any = None
    _body_clock: Any = None
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
        self._stop_clock("_header_clock")
        super().allHeadersReceived()
        if self.length != 0 and not self.refused and limits.is_acp_target(self.request_target):
            timeout = float(acp_settings.BODY_TIMEOUT_SECONDS)
            self._body_clock = self.callLater(timeout, partial(self._timed_out, limits.BODY_TIMEOUT))

    def rawDataReceived(self, data: bytes) -> None:
        if not self.refused:
            super().rawDataReceived(data)

    def allContentReceived(self) -> None:
        self._stop_clock("_body_clock")
        if not self.refused:
            super().allContentReceived()

    def requestDone(self, request: Any) -> None:
        # Started before the buffered next request (if any) is parsed, which may stop it again.
        if self.persistent:
            self._start_header_clock()
        super().requestDone(request)

    def connectionLost(self, reason: Any) -> None:
        self._stop_clock("_header_clock")
        self._stop_clock("_body_clock")
        self._stop_clock("_linger")
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
        self._stop_clock("_header_clock")
        self._stop_clock("_body_clock")
        self.transport.write(limits.plain_text_response(status, reason, text))
        if not linger:
            self.loseConnection()
        # Lingering, or flushing to a client that does not read: either way, not forever.
        self._linger = self.callLater(LINGER_SECONDS, self.transport.abortConnection)

    def _start_header_clock(self) -> None:
        self._stop_clock("_header_clock")
        self._request_begun = False
        timeout = float(acp_settings.HEADER_TIMEOUT_SECONDS)
        self._header_clock = self.callLater(timeout, partial(self._timed_out, limits.HEADERS_TIMEOUT))

    def _stop_clock(self, name: str) -> None:
        clock = getattr(self, name)
        if clock is not None:
            setattr(self, name, None)
            if clock.active():
                clock.cancel()

    def _timed_out(self, text: str) -> None:
        self._header_clock = self._body_clock = None
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
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        channel = self.channel
        if isinstance(channel, GuardedHTTPChannel) and channel.refused:
            return
        if self.acp_body_limit is not None:
            self.acp_body_size += len(data)
            if self.acp_body_size > self.acp_body_limit:
                if isinstance(channel, GuardedHTTPChannel):
                    channel.refuse(413, "Content Too Large", limits.BODY_TOO_LARGE)
                return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        channel = self.channel
        if isinstance(channel, GuardedHTTPChannel):
            if channel.refused:
                return
            channel.served_a_request = True
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
