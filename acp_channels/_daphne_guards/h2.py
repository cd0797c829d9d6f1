"""HTTP/2 streams as Twisted serves them, and the 413 answered on one of them.

HTTP/2 (daphne over TLS, h2 chosen through ALPN) is served by Twisted's H2Connection, one
H2Stream per request, with the same request class: the HTTP/1.1 channel of `reading` is only the
first protocol of the connection, and once h2 is chosen its clocks do nothing. There:

- Body size: a declared length over the limit is answered 413 at the headers and a body without
  one as soon as it passes the limit, by `H2BodyRefusal`: the answer is written on the stream
  (HEADERS and DATA with END_STREAM), the rest of the body is read and dropped (its window given
  back, so a client that sends all before reading gets the answer) until the client ends it, or
  for LINGER_SECONDS at most; then the stream is reset. Other streams are untouched.
- The read timeouts (408) and the 431/414 header answers do not apply: h2 frames headers itself
  (HPACK), and Twisted's connection idle timeout is the only clock. Front hostile networks with
  a proxy (docs/http2.md).

Send backpressure over HTTP/2 is in `backpressure`.
"""

from __future__ import annotations

from typing import Any


def h2_connection_of(channel: Any) -> Any:
    """The H2Connection of a request's channel when it is an HTTP/2 stream (Twisted's H2Stream:
    a `streamID` and its connection), else None."""
    connection = getattr(channel, "_conn", None)
    if connection is None or not isinstance(getattr(channel, "streamID", None), int):
        return None
    return connection


class H2BodyRefusal:
    """A 413 for one HTTP/2 stream whose body is over the limit (see the module docstring): the
    answer goes out on the stream while the stream stays known to Twisted, so the rest of the
    client's body is read and dropped (its window given back) until the client ends it or
    `linger` seconds (LINGER_SECONDS) pass; then the stream is forgotten (reset if the client is
    still sending)."""

    def __init__(self, stream: Any, status: int, text: str, *, linger: float) -> None:
        self.stream = stream
        self.connection = stream._conn
        self.status = status
        self.body = text.encode()
        self.answered = False
        self.client_done = False
        self._linger_seconds = linger
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
            self._linger = self.connection._reactor.callLater(self._linger_seconds, self._forget, True)

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
