"""Blocking raw-socket HTTP/1.1 and WebSocket helpers for hostile-client tests and the
adversarial benchmark (bench/adversarial.py).

httpx and websockets normalise what they send (header names and values, Content-Length, frame
masking and UTF-8); these helpers put exactly the given bytes on the wire and read exactly what
comes back, with a deadline on every read, so a test can tell an answer from a clean close from
a hang.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

HeaderList = Iterable[tuple[str | bytes, str | bytes]]


class Hang(Exception):
    """The server neither answered nor closed within the deadline."""


@dataclass
class RawResponse:
    status: int
    headers: list[tuple[str, str]]
    body: bytes = b""

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((value for key, value in self.headers if key.lower() == name), None)


@dataclass
class Closed:
    """The server closed (or reset) the socket without a response; `partial` is what it sent."""

    partial: bytes = b""
    reset: bool = False


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("latin-1")


def request_bytes(
    method: str | bytes,
    target: str | bytes,
    headers: HeaderList = (),
    body: bytes | None = None,
    *,
    content_length: bool = True,
    host: str = "127.0.0.1",
    version: bytes = b"HTTP/1.1",
) -> bytes:
    """A request exactly as given. With a body and `content_length`, a correct Content-Length is
    appended after the given headers (pass False to send your own, or a lie)."""
    lines = [_bytes(method) + b" " + _bytes(target) + b" " + version, b"Host: " + host.encode()]
    lines += [_bytes(name) + b": " + _bytes(value) for name, value in headers]
    if body is not None and content_length:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")


def connect(port: int, timeout: float = 10.0, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connect, so the window is small from the handshake on
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.connect(("127.0.0.1", port))
    return sock


class Reader:
    """Buffered reads from a socket, each bounded by an absolute deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buffer = bytearray()
        self.eof = False
        self.reset = False

    def _fill(self) -> bool:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise Hang(f"no answer in time; got {bytes(self.buffer[:200])!r}")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError as error:
            raise Hang(f"no answer in time; got {bytes(self.buffer[:200])!r}") from error
        except (ConnectionResetError, BrokenPipeError):
            self.reset = True
            data = b""
        if not data:
            self.eof = True
            return False
        self.buffer += data
        return True

    def until(self, marker: bytes) -> bytes | None:
        while (end := self.buffer.find(marker)) < 0:
            if not self._fill():
                return None
        out = bytes(self.buffer[: end + len(marker)])
        del self.buffer[: end + len(marker)]
        return out

    def exactly(self, size: int) -> bytes | None:
        while len(self.buffer) < size:
            if not self._fill():
                return None
        out = bytes(self.buffer[:size])
        del self.buffer[:size]
        return out

    def rest(self) -> bytes:
        while self._fill():
            pass
        out = bytes(self.buffer)
        self.buffer.clear()
        return out


def parse_head(head: bytes) -> tuple[int, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    return status, headers


def read_response(sock: socket.socket, timeout: float = 10.0, *, head_only: bool = False) -> RawResponse | Closed:
    """One response (a 1xx interim response is skipped), or Closed; raises Hang past the deadline.
    `head_only` stops after the head (for streams)."""
    reader = Reader(sock, time.monotonic() + timeout)
    while True:
        head = reader.until(b"\r\n\r\n")
        if head is None:
            return Closed(bytes(reader.buffer), reader.reset)
        status, headers = parse_head(head[:-4])
        if status >= 200 or status == 101:
            break
    response = RawResponse(status, headers)
    if head_only or status in (101, 204, 304):
        response.body = bytes(reader.buffer)
        return response
    length = response.header("content-length")
    if response.header("transfer-encoding") == "chunked":
        response.body = _dechunk(reader)
    elif length is not None:
        response.body = reader.exactly(int(length)) or b""
    else:
        response.body = reader.rest()
    return response


def _dechunk(reader: Reader) -> bytes:
    parts = []
    while (line := reader.until(b"\r\n")) is not None:
        size = int(line.split(b";")[0], 16)
        chunk = reader.exactly(size + 2)
        if size == 0 or chunk is None:
            break
        parts.append(chunk[:-2])
    return b"".join(parts)


def exchange(port: int, raw: bytes, timeout: float = 10.0) -> RawResponse | Closed:
    """Send `raw` on a new socket and read one response (or the close)."""
    with connect(port, timeout) as sock:
        try:
            sock.sendall(raw)
        except (ConnectionResetError, BrokenPipeError):
            pass  # the server may answer and close before taking everything
        return read_response(sock, timeout)


# -- JSON-RPC over HTTP -------------------------------------------------------------------------


def post_json(
    port: int, body: Any, connection_id: str | None = None, session_id: str | None = None, timeout: float = 10.0
) -> RawResponse | Closed:
    headers: list[tuple[str, str]] = [("Content-Type", "application/json"), ("Connection", "close")]
    if connection_id is not None:
        headers.append(("Acp-Connection-Id", connection_id))
    if session_id is not None:
        headers.append(("Acp-Session-Id", session_id))
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return exchange(port, request_bytes("POST", "/acp", headers, data), timeout)


def initialize(port: int, timeout: float = 10.0) -> str:
    """POST initialize; the new connection id."""
    response = post_json(
        port, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}, timeout=timeout
    )
    assert isinstance(response, RawResponse) and response.status == 200, response
    connection_id = response.header("acp-connection-id")
    assert connection_id, response
    return connection_id


def delete(port: int, connection_id: str, timeout: float = 10.0) -> RawResponse | Closed:
    headers = [("Acp-Connection-Id", connection_id), ("Connection", "close")]
    return exchange(port, request_bytes("DELETE", "/acp", headers), timeout)


def stream_request(connection_id: str, session_id: str | None = None) -> bytes:
    headers = [("Accept", "text/event-stream"), ("Acp-Connection-Id", connection_id)]
    if session_id is not None:
        headers.append(("Acp-Session-Id", session_id))
    return request_bytes("GET", "/acp", headers)


@dataclass
class SseStream:
    """A GET stream read event by event (blocking): `events()` yields each event's parsed data."""

    sock: socket.socket
    status: int
    reader: Reader
    _chunk_left: int = 0
    _text: bytearray = field(default_factory=bytearray)

    @classmethod
    def open(cls, port: int, connection_id: str, session_id: str | None = None, timeout: float = 10.0) -> SseStream:
        sock = connect(port, timeout)
        sock.sendall(stream_request(connection_id, session_id))
        reader = Reader(sock, time.monotonic() + timeout)
        head = reader.until(b"\r\n\r\n")
        if head is None:
            sock.close()
            raise ConnectionError("stream closed before its head")
        status, _ = parse_head(head[:-4])
        return cls(sock, status, reader)

    def _body_bytes(self) -> bytes | None:
        """The next decoded piece of the chunked body, or None at its end or on close."""
        if self._chunk_left == 0:
            line = self.reader.until(b"\r\n")
            if line is None:
                return None
            size = int(line.split(b";")[0], 16)
            if size == 0:
                return None
            self._chunk_left = size
        if not self.reader.buffer and not self.reader._fill():
            return None
        data = self.reader.exactly(min(self._chunk_left, len(self.reader.buffer)))
        assert data is not None
        self._chunk_left -= len(data)
        if self._chunk_left == 0:
            self.reader.exactly(2)  # the chunk's CRLF
        return data

    def events(self, timeout: float) -> Iterator[Any]:
        """Events until the stream ends; raises Hang when none comes within `timeout` of the
        previous one."""
        while True:
            self.reader.deadline = time.monotonic() + timeout
            scanned = 0  # where the search for the event's end resumes (events can be megabytes)
            while (end := self._text.find(b"\n\n", scanned)) < 0:
                scanned = max(len(self._text) - 1, 0)
                data = self._body_bytes()
                if data is None:
                    return
                self._text += data
            block = bytes(self._text[:end])
            del self._text[: end + 2]
            lines = [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
            if lines:
                text = b"\n".join(lines)
                try:
                    yield json.loads(text)
                except ValueError:
                    yield text.decode("utf-8", "replace")

    def until_reply(self, request_id: Any, timeout: float = 10.0) -> Any:
        """Events until the reply with this id (a batch reply counts if it contains it)."""
        for event in self.events(timeout):
            if isinstance(event, dict) and event.get("id") == request_id and "method" not in event:
                return event
            if isinstance(event, list) and any(isinstance(e, dict) and e.get("id") == request_id for e in event):
                return event
        raise ConnectionError(f"stream ended before the reply to {request_id!r}")

    def close(self) -> None:
        self.sock.close()


# -- WebSocket ------------------------------------------------------------------------------------

TEXT, BINARY, CLOSE, PING, PONG, CONTINUATION = 0x1, 0x2, 0x8, 0x9, 0xA, 0x0


def ws_frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bool = True, rsv: int = 0) -> bytes:
    """One client frame exactly as asked (clients must mask; `mask=False` breaks that rule)."""
    size = len(payload)
    first = (0x80 if fin else 0) | (rsv & 0x7) << 4 | opcode
    mask_bit = 0x80 if mask else 0
    if size < 126:
        head = bytes([first, mask_bit | size])
    elif size < 65536:
        head = bytes([first, mask_bit | 126]) + size.to_bytes(2, "big")
    else:
        head = bytes([first, mask_bit | 127]) + size.to_bytes(8, "big")
    if not mask:
        return head + payload
    key = os.urandom(4)
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload)) if size < 4096 else _mask_fast(payload, key)
    return head + key + masked


def _mask_fast(payload: bytes, key: bytes) -> bytes:
    keys = int.from_bytes((key * (len(payload) // 4 + 1))[: len(payload)], "big")
    return (int.from_bytes(payload, "big") ^ keys).to_bytes(len(payload), "big")


def ws_handshake(
    port: int, headers: HeaderList = (), timeout: float = 10.0, rcvbuf: int | None = None
) -> tuple[socket.socket, RawResponse | Closed]:
    """Open a socket and send an upgrade; the socket and the server's answer (101 or not)."""
    sock = connect(port, timeout, rcvbuf)
    key = base64.b64encode(os.urandom(16)).decode()
    upgrade = [
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", key),
        ("Sec-WebSocket-Version", "13"),
        *headers,
    ]
    sock.sendall(request_bytes("GET", "/acp", upgrade))
    return sock, read_response(sock, timeout, head_only=True)


class WsReader:
    """Server frames from a socket after the 101: `next()` is (opcode, payload) or None on close."""

    def __init__(self, sock: socket.socket, leftover: bytes = b"") -> None:
        self.reader = Reader(sock, 0.0)
        self.reader.buffer += leftover

    def next(self, timeout: float = 10.0) -> tuple[int, bytes] | None:
        self.reader.deadline = time.monotonic() + timeout
        message = b""
        while True:
            head = self.reader.exactly(2)
            if head is None:
                return None
            size = head[1] & 0x7F
            if size == 126:
                more = self.reader.exactly(2)
                size = int.from_bytes(more or b"\0\0", "big")
            elif size == 127:
                more = self.reader.exactly(8)
                size = int.from_bytes(more or b"\0" * 8, "big")
            payload = self.reader.exactly(size) if size else b""
            if payload is None:
                return None
            opcode = head[0] & 0x0F
            if opcode >= 0x8:  # control frames may interleave with fragments
                return opcode, payload
            message += payload
            if head[0] & 0x80:
                return (opcode or TEXT), message

    def json_until(self, request_id: Any, timeout: float = 10.0) -> Any:
        """Text messages until the reply with this id."""
        while (frame := self.next(timeout)) is not None:
            opcode, payload = frame
            if opcode == CLOSE:
                break
            if opcode == TEXT:
                value = json.loads(payload)
                if isinstance(value, dict) and value.get("id") == request_id and "method" not in value:
                    return value
        raise ConnectionError(f"socket closed before the reply to {request_id!r}")
