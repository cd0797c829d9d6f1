"""The editor's side of the bridge: newline-delimited messages on stdin and stdout.

Pipes and sockets (what an editor gives a stdio agent) are read and written by the event loop.
A terminal or a regular file (`acp-bridge URL < messages.jsonl`) cannot be: those are read and
written by a thread, blocking, as a plain program would.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import stat
import sys
import threading
from typing import BinaryIO, Protocol

__all__ = ["LineSink", "LineSource", "LineSplitter", "LineTooLong", "StdinLines", "StdoutLines"]

_CHUNK = 256 * 1024
#: At exit, how long to wait for the editor to read what is still buffered for stdout.
_CLOSE_FLUSH_TIMEOUT = 5.0


class LineTooLong(Exception):
    """A line longer than the limit was skipped (up to and including its newline)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a message longer than {limit} bytes was skipped")
        self.limit = limit


class LineSource(Protocol):
    async def read_line(self) -> bytes | None:
        """The next line without its newline; None at end of input. Raises `LineTooLong`."""


class LineSink(Protocol):
    async def write_line(self, text: str) -> None:
        """Write `text` and a newline; raises OSError (BrokenPipeError) when nobody reads."""


class LineSplitter:
    """Cut a byte stream into lines of at most `limit` bytes: `feed(chunk)` returns the lines
    it completed; an over-long line is dropped and reported once, as a `LineTooLong` entry."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buffer = bytearray()
        self._skipping = False

    def feed(self, chunk: bytes) -> list[bytes | LineTooLong]:
        lines: list[bytes | LineTooLong] = []
        buffer = self._buffer
        start = len(buffer)
        buffer += chunk
        begin = 0
        while (end := buffer.find(b"\n", max(begin, start))) != -1:
            if self._skipping:
                self._skipping = False
            elif end - begin > self.limit:
                lines.append(LineTooLong(self.limit))
            else:
                lines.append(bytes(buffer[begin:end]))
            begin = end + 1
            start = begin
        del buffer[:begin]
        if len(buffer) > self.limit:
            if not self._skipping:
                lines.append(LineTooLong(self.limit))
                self._skipping = True
            buffer.clear()
        return lines

    def finish(self) -> bytes | None:
        """What is left at end of input: a last line without a newline, if any."""
        rest = None if self._skipping or not self._buffer else bytes(self._buffer)
        self._buffer.clear()
        return rest


def _is_pipe(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class StdinLines:
    """`LineSource` over a file descriptor (stdin by default)."""

    def __init__(self, limit: int, stream: BinaryIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdin.buffer
        self._fd = self._stream.fileno()
        self._splitter = LineSplitter(limit)
        self._ready: collections.deque[bytes | LineTooLong] = collections.deque()
        self._reader: asyncio.StreamReader | None = None
        self._eof = False

    async def _open(self) -> None:
        if self._reader is not None:
            return
        loop = asyncio.get_running_loop()
        self._reader = reader = asyncio.StreamReader(limit=_CHUNK)
        if _is_pipe(self._fd):
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), self._stream)
        else:
            # A daemon thread: a read blocked on a terminal must not keep the process alive.
            threading.Thread(target=self._read_blocking, args=(loop, reader), daemon=True).start()

    def _read_blocking(self, loop: asyncio.AbstractEventLoop, reader: asyncio.StreamReader) -> None:
        try:
            while chunk := os.read(self._fd, _CHUNK):
                loop.call_soon_threadsafe(reader.feed_data, chunk)
        except OSError:
            pass
        finally:
            try:
                loop.call_soon_threadsafe(reader.feed_eof)
            except RuntimeError:
                pass  # the loop has ended

    async def _read_chunk(self) -> bytes:
        await self._open()
        assert self._reader is not None
        return await self._reader.read(_CHUNK)

    async def read_line(self) -> bytes | None:
        while not self._ready:
            if self._eof:
                return None
            chunk = await self._read_chunk()
            if chunk:
                self._ready.extend(self._splitter.feed(chunk))
            else:
                self._eof = True
                if (rest := self._splitter.finish()) is not None:
                    self._ready.append(rest)
        line = self._ready.popleft()
        if isinstance(line, LineTooLong):
            raise line
        return line


class StdoutLines:
    """`LineSink` over a file descriptor (stdout by default); waits while the reader is behind."""

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout.buffer
        self._fd = self._stream.fileno()
        self._writer: asyncio.StreamWriter | None = None
        self._opened = False
        self._lock = asyncio.Lock()

    async def _open(self) -> None:
        if self._opened:
            return
        self._opened = True
        if _is_pipe(self._fd):
            loop = asyncio.get_running_loop()
            transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, self._stream)
            self._writer = asyncio.StreamWriter(transport, protocol, None, loop)

    async def write_line(self, text: str) -> None:
        data = text.encode() + b"\n"
        async with self._lock:  # whole lines, never interleaved
            await self._open()
            if self._writer is not None:
                if self._writer.transport.is_closing():
                    raise BrokenPipeError("stdout is closed")
                self._writer.write(data)
                await self._writer.drain()
            else:
                await asyncio.to_thread(self._write_blocking, data)

    def _write_blocking(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    async def close(self) -> None:
        if self._writer is not None:
            # drain() only waits while the transport holds more than its high-water mark: what it
            # still holds would be dropped when the process ends right after. Wait (bounded: the
            # editor may have stopped reading) until the pipe has taken all of it.
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(_CLOSE_FLUSH_TIMEOUT):
                    self._writer.transport.set_write_buffer_limits(high=0)
                    await self._writer.drain()
            self._writer.close()
