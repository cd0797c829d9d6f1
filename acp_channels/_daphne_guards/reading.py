"""Request reading: read timeouts (408), header sizes (431/414) and the body size (413).

Each guard exists because daphne and Twisted leave a gap:

- Body size (`GuardedWebRequest`). Twisted reads the whole body before the request is
  processed and daphne then queues all of it for the application, so a 1 GiB POST costs more
  than 1 GiB before the view's 413. For the ACP endpoint (known from the request line once the
  headers are in) a declared Content-Length over MAX_BODY_BYTES is refused before any body is
  read, and a chunked body as soon as it passes the limit (over HTTP/2: `h2.H2BodyRefusal`).
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
414 or 431 (the client may still be sending) keeps reading and discarding for LINGER_SECONDS, or
until the client closes, so that the client reads the answer instead of a connection reset.
"""

from __future__ import annotations

import time
from typing import Any, Final

from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.web import http

from acp_channels import _limits as limits
from acp_channels._conf import acp_settings
from acp_channels._daphne_guards.backpressure import SendGate
from acp_channels._daphne_guards.h2 import H2BodyRefusal, h2_connection_of

# Twisted's HTTP classes are mostly untyped: subclassed and called through Any.
HTTPChannel: Any = http.HTTPChannel
GenericHTTPChannelProtocol: Any = http._GenericHTTPChannelProtocol

#: How long a refused connection keeps reading (and discarding) before it is cut.
LINGER_SECONDS: Final = 5.0


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
            self._start_clock(acp_settings.BODY_TIMEOUT_SECONDS, limits.BODY_TIMEOUT)

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
        self._start_clock(acp_settings.HEADER_TIMEOUT_SECONDS, limits.HEADERS_TIMEOUT)

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
            self.acp_body_limit = acp_settings.MAX_BODY_BYTES
            if length is not None and length > self.acp_body_limit:
                # Refused before any body is read; no `100 Continue` may follow the answer.
                self.requestHeaders.removeHeader(b"Expect")
                channel.refuse(413, "Content Too Large", limits.BODY_TOO_LARGE)
                return
        elif h2_connection_of(channel) is not None and limits.is_acp_target(channel.path or b""):
            # HTTP/2: the pseudo-headers (:path) come before every other header, so the target
            # is known whenever the length is.
            self.acp_body_limit = acp_settings.MAX_BODY_BYTES
            if length is not None and length > self.acp_body_limit:
                self.requestHeaders.removeHeader(b"Expect")
                self._refuse_h2()
                super().gotLength(0)  # a small buffer, never written
                return
        super().gotLength(length)

    def _refuse_h2(self) -> None:
        if self.acp_h2_refusal is None:
            self.acp_h2_refusal = H2BodyRefusal(self.channel, 413, limits.BODY_TOO_LARGE, linger=LINGER_SECONDS)

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
