"""A bare HTTP/2 client over TLS for tests that misbehave on purpose: it chooses its flow-control
windows, can stop acknowledging one stream's data (its window runs out: the h2 way of not
reading a stream) or stop reading the socket altogether, and sends bodies as it likes (a
declared length it never sends, DATA past a limit).

Built on the `h2` package (the http2 extra); `RawH2.open(port, cafile)` negotiates h2 through
ALPN and fails if the server picks anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.settings


@dataclass
class H2Stream:
    """What arrived on one stream."""

    stream_id: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    #: Data received but not acknowledged (the stream's window is that much smaller).
    unacknowledged: int = 0
    acknowledge: bool = True
    response: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False
    reset: int | None = None

    @property
    def status(self) -> int:
        return int(self.headers[":status"])


class RawH2:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: h2.connection.H2Connection
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.h2 = connection
        self.streams: dict[int, H2Stream] = {}
        self.reading = asyncio.Event()
        self.reading.set()
        #: The server's first SETTINGS arrived (then `self.h2.remote_settings` holds them).
        self.settings_received = asyncio.Event()
        self.closed = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    @classmethod
    async def open(
        cls,
        port: int,
        cafile: str,
        *,
        initial_window: int = 65535,
        connection_window: int = 0,
        receive_buffer: int | None = None,
    ) -> RawH2:
        """A connection to 127.0.0.1:`port`. `initial_window`: each stream's receive window;
        `connection_window`: added to the connection's (65535 to start with); `receive_buffer`:
        the socket's kernel receive buffer (small: the server's writes block as soon as the
        client stops reading)."""
        context = ssl.create_default_context(cafile=cafile)
        context.set_alpn_protocols(["h2"])
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(
            sock=sock, ssl=context, server_hostname="127.0.0.1", limit=64 * 1024
        )
        chosen = writer.get_extra_info("ssl_object").selected_alpn_protocol()
        assert chosen == "h2", f"the server chose {chosen!r}, not h2"
        connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        connection.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: initial_window}
        )
        connection.initiate_connection()
        if connection_window:
            connection.increment_flow_control_window(connection_window)
        raw = cls(reader, writer, connection)
        await raw.flush()
        return raw

    async def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def request(
        self,
        method: str,
        port: int,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        *,
        end_stream: bool = True,
        acknowledge: bool = True,
        path: str = "/acp",
    ) -> H2Stream:
        """Start a request; with `end_stream` False the body stays open (`send_data` goes on)."""
        stream_id = self.h2.get_next_available_stream_id()
        stream = self.streams[stream_id] = H2Stream(stream_id, acknowledge=acknowledge)
        pseudo = [(":method", method), (":scheme", "https"), (":authority", f"127.0.0.1:{port}"), (":path", path)]
        fields = pseudo + [(name.lower(), value) for name, value in (headers or {}).items()]
        self.h2.send_headers(stream_id, fields, end_stream=end_stream and body is None)
        if body is not None:
            self.h2.send_data(stream_id, body, end_stream=end_stream)
        await self.flush()
        return stream

    async def send_data(self, stream: H2Stream, data: bytes, *, end_stream: bool = False) -> None:
        """Send `data` on a stream as the windows allow (waits for the server's updates)."""
        view = memoryview(data)
        while view:
            window = min(self.h2.local_flow_control_window(stream.stream_id), self.h2.max_outbound_frame_size)
            if window <= 0 or stream.ended or stream.reset is not None:
                if stream.ended or stream.reset is not None:
                    return  # answered (or reset) already: nothing more is wanted
                stream.changed.clear()
                await stream.changed.wait()
                continue
            self.h2.send_data(stream.stream_id, bytes(view[:window]))
            view = view[window:]
            await self.flush()
        if end_stream:
            self.h2.end_stream(stream.stream_id)
            await self.flush()

    def acknowledge(self, stream: H2Stream) -> None:
        """Start acknowledging a stream's data again, and give back what it held."""
        stream.acknowledge = True
        if stream.unacknowledged:
            self.h2.acknowledge_received_data(stream.unacknowledged, stream.stream_id)
            stream.unacknowledged = 0
            self.writer.write(self.h2.data_to_send())

    def stop_reading(self) -> None:
        """Stop reading the socket (what the server writes stays in the kernel, then with it)."""
        self.reading.clear()

    def resume_reading(self) -> None:
        self.reading.set()

    async def _read(self) -> None:
        try:
            while True:
                await self.reading.wait()
                data = await self.reader.read(65536)
                if not data:
                    return
                for event in self.h2.receive_data(data):
                    self._handle(event)
                outgoing = self.h2.data_to_send()
                if outgoing:
                    self.writer.write(outgoing)
        except (ConnectionError, ssl.SSLError):
            return
        finally:
            self.closed.set()
            for stream in self.streams.values():
                stream.changed.set()
                stream.response.set()

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RemoteSettingsChanged):
            self.settings_received.set()
        stream = self.streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ResponseReceived) and stream is not None:
            stream.headers = {str(name): str(value) for name, value in event.headers}
            stream.response.set()
        elif isinstance(event, h2.events.DataReceived) and stream is not None:
            stream.body += event.data
            if stream.acknowledge:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            else:
                stream.unacknowledged += event.flow_controlled_length
        elif isinstance(event, h2.events.StreamEnded) and stream is not None:
            stream.ended = True
        elif isinstance(event, h2.events.StreamReset) and stream is not None:
            stream.reset = event.error_code
            stream.response.set()
        elif isinstance(event, h2.events.WindowUpdated):
            for each in self.streams.values() if event.stream_id == 0 else [stream] if stream else []:
                each.changed.set()
        if stream is not None:
            stream.changed.set()

    async def wait(self, stream: H2Stream, condition: str, timeout: float = 10.0) -> None:
        """Wait until `condition` holds for the stream: "response", "ended"."""
        async with asyncio.timeout(timeout):
            while not (stream.headers if condition == "response" else stream.ended):
                if stream.reset is not None or self.closed.is_set():
                    raise AssertionError(f"stream {stream.stream_id} reset ({stream.reset}) or connection closed")
                stream.changed.clear()
                await stream.changed.wait()

    async def wait_body(self, stream: H2Stream, needle: bytes, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while needle not in stream.body:
                if stream.ended or stream.reset is not None or self.closed.is_set():
                    raise AssertionError(f"stream {stream.stream_id} ended without {needle!r}")
                stream.changed.clear()
                await stream.changed.wait()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task
        self.writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await self.writer.wait_closed()
