"""The raw wire, for the load generator: HTTP/1.1 requests, SSE streams and WebSocket, on asyncio.

No HTTP library: every byte is written and parsed here, so the load generator costs as little
as possible per message (one `bytes.split` per read for SSE, a few slices per WebSocket frame).
`bench.rawserver` measures how fast this side can read, against a server that does nothing.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

EventHandler = Callable[[bytes], None]


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes = b""


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), value.strip())  # first value wins
    return status, headers


def _target(url: str) -> str:
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _request_head(method: str, host: str, path: str, headers: dict[str, str], body: bytes | None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class HttpConnection:
    """One keep-alive HTTP/1.1 connection for plain requests (POST, DELETE), one at a time."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.netloc
        self.hostname = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.path = _target(url)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()

    async def _connect(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.hostname, self.port, limit=1 << 24)

    async def request(self, method: str, headers: dict[str, str], body: bytes | None = None) -> Response:
        async with self._lock:
            # A keep-alive connection the server closed while idle (uvicorn: after 5 s) is
            # replaced before use, as HTTP clients do with their pools.
            reused = self._writer is not None and not self._writer.is_closing()
            if reused and self._reader is not None and self._reader.at_eof():
                self.close()
                reused = False
            if not reused:
                await self._connect()
            assert self._reader is not None and self._writer is not None
            request = _request_head(method, self.host, self.path, headers, body) + (body or b"")
            self._writer.write(request)
            try:
                head = await self._reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionResetError) as error:
                # Closed by the server as we sent, before any byte of a response: send again
                # on a new connection (the request was not processed).
                if not reused or (isinstance(error, asyncio.IncompleteReadError) and error.partial):
                    raise
                self.close()
                await self._connect()
                assert self._reader is not None and self._writer is not None
                self._writer.write(request)
                head = await self._reader.readuntil(b"\r\n\r\n")
            status, response_headers = _parse_head(head)
            if "content-length" in response_headers:
                data = await self._reader.readexactly(int(response_headers["content-length"]))
            elif response_headers.get("transfer-encoding", "").lower() == "chunked":
                parts = []
                while True:
                    size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    chunk = await self._reader.readexactly(size + 2)
                    if size == 0:
                        break
                    parts.append(chunk[:-2])
                data = b"".join(parts)
            elif status in (204, 304) or status < 200:
                data = b""
            else:
                data = await self._reader.read()  # body until close
                self.close()
            if response_headers.get("connection", "").lower() == "close":
                self.close()
            return Response(status, response_headers, data)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class SseStream(asyncio.Protocol):
    """A GET whose response is an SSE stream: each event's data goes to `on_event` as bytes.

    Only `data:` lines count (comments, `id:`, `event:` are skipped), as ACP clients do. A
    leading `id:` line (acp_channels numbers its events) keeps the event on the fast path.
    """

    def __init__(self, on_event: EventHandler) -> None:
        self.on_event = on_event
        self.head = asyncio.get_running_loop().create_future()  # -> Response (headers only)
        self.ended = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self._raw = bytearray()
        self._events = b""
        self._in_body = False
        self._chunked = False
        self._remaining = 0  # bytes left in the current chunk
        self._crlf = False  # a chunk's trailing CRLF is still to come
        self.events = 0

    @classmethod
    async def open(cls, url: str, headers: dict[str, str], on_event: EventHandler) -> SseStream:
        parts = urlsplit(url)
        loop = asyncio.get_running_loop()
        _, stream = await loop.create_connection(lambda: cls(on_event), parts.hostname, parts.port or 80)
        assert stream.transport is not None
        stream.transport.write(_request_head("GET", parts.netloc, _target(url), headers, None))
        return stream

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.head.done():
            self.head.set_exception(ConnectionError("closed before the response head"))
        if not self.ended.done():
            self.ended.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if not self._in_body:
            self._raw += data
            end = self._raw.find(b"\r\n\r\n")
            if end < 0:
                return
            status, headers = _parse_head(bytes(self._raw[:end]))
            data = bytes(self._raw[end + 4 :])
            self._raw.clear()
            self._in_body = True
            self._chunked = headers.get("transfer-encoding", "").lower() == "chunked"
            self.head.set_result(Response(status, headers))
            if status != 200:
                self.close()
                return
            if not data:
                return
        if self._chunked:
            self._dechunk(data)
        else:
            self._feed(data)

    def _dechunk(self, data: bytes) -> None:
        raw = self._raw
        raw += data
        out = []
        pos, size = 0, len(raw)
        while pos < size:
            if self._remaining:
                take = min(self._remaining, size - pos)
                out.append(raw[pos : pos + take])
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._crlf = True
            elif self._crlf:
                if size - pos < 2:
                    break
                pos += 2
                self._crlf = False
            else:
                line_end = raw.find(b"\r\n", pos)
                if line_end < 0:
                    break
                length = int(raw[pos:line_end].split(b";")[0], 16)
                pos = line_end + 2
                if length == 0:  # the last chunk: the stream ended
                    self.close()
                    break
                self._remaining = length
        del raw[:pos]
        if out:
            self._feed(b"".join(out))

    def _feed(self, data: bytes) -> None:
        blocks = (self._events + data).split(b"\n\n") if self._events else data.split(b"\n\n")
        self._events = blocks.pop()
        on_event = self.on_event
        for block in blocks:
            if block.startswith(b"id: "):  # acp_channels: an id line, then the data line (ids are not used)
                block = block[block.find(b"\n") + 1 :]
            if block.startswith(b"data: ") and b"\n" not in block:
                self.events += 1
                on_event(block[6:])
            else:  # comments, several lines, id:/event: fields, CRLF line ends
                self._slow(block)

    def _slow(self, block: bytes) -> None:
        data = [
            line[5:].removeprefix(b" ")
            for line in block.replace(b"\r\n", b"\n").split(b"\n")
            if line.startswith(b"data:")
        ]
        if data:
            self.events += 1
            self.on_event(b"\n".join(data))


def _mask(payload: bytes, key: bytes) -> bytes:
    size = len(payload)
    if not size:
        return payload
    keys = int.from_bytes((key * (size // 4 + 1))[:size], "big")
    return (int.from_bytes(payload, "big") ^ keys).to_bytes(size, "big")


def ws_frame(opcode: int, payload: bytes) -> bytes:
    key = os.urandom(4)
    size = len(payload)
    if size < 126:
        head = bytes([0x80 | opcode, 0x80 | size])
    elif size < 65536:
        head = bytes([0x80 | opcode, 0x80 | 126]) + size.to_bytes(2, "big")
    else:
        head = bytes([0x80 | opcode, 0x80 | 127]) + size.to_bytes(8, "big")
    return head + key + _mask(payload, key)


class WebSocket(asyncio.Protocol):
    """A client WebSocket: text messages go to `on_message` as bytes."""

    def __init__(self, on_message: EventHandler) -> None:
        loop = asyncio.get_running_loop()
        self.on_message = on_message
        self.head = loop.create_future()
        self.ended = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self._buf = b""
        self._open = False
        self._fragments: list[bytes] = []
        self.messages = 0

    @classmethod
    async def open(cls, url: str, on_message: EventHandler, headers: dict[str, str] | None = None) -> WebSocket:
        parts = urlsplit(url)
        loop = asyncio.get_running_loop()
        _, socket = await loop.create_connection(lambda: cls(on_message), parts.hostname, parts.port or 80)
        key = base64.b64encode(os.urandom(16)).decode()
        request = {
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": key,
            "Sec-WebSocket-Version": "13",
            **(headers or {}),
        }
        assert socket.transport is not None
        socket.transport.write(_request_head("GET", parts.netloc, _target(url), request, None))
        response = await socket.head
        if response.status != 101:
            socket.close()
            raise ConnectionError(f"WebSocket upgrade answered {response.status}")
        return socket

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.head.done():
            self.head.set_exception(ConnectionError("closed before the upgrade"))
        if not self.ended.done():
            self.ended.set_result(None)

    def send_text(self, text: bytes) -> None:
        assert self.transport is not None
        self.transport.write(ws_frame(0x1, text))

    def close(self, code: int = 1000) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(ws_frame(0x8, code.to_bytes(2, "big")))
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        pos = 0
        if not self._open:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self._buf = buf
                return
            status, headers = _parse_head(buf[:end])
            self.head.set_result(Response(status, headers))
            self._open = True
            pos = end + 4
        size = len(buf)
        on_message = self.on_message
        while size - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            length = b1 & 0x7F
            header = 2
            if length == 126:
                if size - pos < 4:
                    break
                length = int.from_bytes(buf[pos + 2 : pos + 4], "big")
                header = 4
            elif length == 127:
                if size - pos < 10:
                    break
                length = int.from_bytes(buf[pos + 2 : pos + 10], "big")
                header = 10
            key = b""
            if b1 & 0x80:  # servers do not mask, but be lenient
                if size - pos < header + 4:
                    break
                key = buf[pos + header : pos + header + 4]
                header += 4
            end = pos + header + length
            if end > size:
                break
            payload = buf[pos + header : end]
            if key:
                payload = _mask(payload, key)
            pos = end
            opcode = b0 & 0x0F
            if opcode in (0x1, 0x2, 0x0):
                if b0 & 0x80 and not self._fragments:
                    self.messages += 1
                    on_message(payload)
                else:
                    self._fragments.append(payload)
                    if b0 & 0x80:
                        message = b"".join(self._fragments)
                        self._fragments = []
                        self.messages += 1
                        on_message(message)
            elif opcode == 0x9 and self.transport is not None:  # ping
                self.transport.write(ws_frame(0xA, payload))
            elif opcode == 0x8:
                self.close()
        self._buf = buf[pos:]


@dataclass
class Sample:
    """Latency samples in seconds."""

    values: list[float] = field(default_factory=list)

    def percentile(self, p: float) -> float:
        ordered = sorted(self.values)
        if not ordered:
            return float("nan")
        index = min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))
        return ordered[index]
