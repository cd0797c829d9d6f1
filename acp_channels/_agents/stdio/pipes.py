"""What crosses an agent's pipes, as bytes.

- stdin: each client frame becomes one line, its text as it came (`stdin_line`);
- stdout: read one line at a time under a byte budget, nothing ahead of the reader beyond a small
  buffer; an over-long line is dropped, never held whole (`read_line`);
- stderr: read all the time into the `acp_channels.agent` logger (long lines truncated, floods
  rate-limited), so a chatty agent never blocks on it (`StderrLog`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

from acp_channels import _protocol as protocol
from acp_channels._protocol import Frame, Malformed

logger = logging.getLogger("acp_channels.agent")

#: Agent output lines may exceed the body limit by this much (the JSON-RPC envelope of a reply).
LINE_HEADROOM: Final = protocol.MESSAGE_HEADROOM
#: stdout/stderr are read in chunks of up to this size; a paused reader holds at most twice it.
READ_CHUNK: Final = 256 * 1024
STDERR_LINE_MAX: Final = 4096  # characters of one stderr line that reach the log
STDERR_LINES_PER_SECOND: Final = 200  # beyond this, stderr lines are counted, not logged


def stdin_line(frame: Frame) -> bytes | None:
    """A client frame as one stdin line; None when its text cannot be one (not JSON, and it has
    line breaks or is blank)."""
    text = protocol.serialize_frame(frame)
    if "\n" in text or "\r" in text or not text.strip():
        if isinstance(frame, Malformed) and frame.error["error"]["code"] == protocol.PARSE_ERROR:
            return None
        # Valid JSON has line breaks only as whitespace between tokens: a space is the same JSON.
        text = text.replace("\r", " ").replace("\n", " ")
    return text.encode() + b"\n"


async def read_line(stdout: asyncio.StreamReader, limit: int, connection_id: str) -> bytes | None:
    """The next stdout line without its newline, None at the end. A line longer than `limit`
    bytes is dropped (with an error in the log), never held whole."""
    parts: list[bytes] = []
    size = 0
    while True:
        complete = True
        try:
            part = await stdout.readuntil(b"\n")
        except asyncio.LimitOverrunError as error:
            part, complete = await stdout.readexactly(error.consumed), False
        except asyncio.IncompleteReadError as error:
            part = error.partial
            if not part and not size:
                return None
        size += len(part)
        if size <= limit + 1:
            parts.append(part)
        elif parts:
            parts.clear()
        if complete:
            if size > limit + 1:
                logger.error(
                    "agent for connection %s wrote a line of %d bytes, over the %d byte limit: dropped",
                    connection_id,
                    size,
                    limit,
                )
                parts, size = [], 0
                continue
            return b"".join(parts).removesuffix(b"\n")


class StderrLog:
    """Reads an agent's stderr continuously into the log, one record per line."""

    def __init__(self, connection_id: str) -> None:
        self.connection_id = connection_id
        self.pid: int | None = None
        #: The last line read (for the log line that tells how the agent ended).
        self.last = ""
        self._window = 0.0
        self._logged = 0
        self._suppressed = 0

    async def read(self, stderr: asyncio.StreamReader, pid: int) -> None:
        self.pid = pid
        head = bytearray()  # the start of the current line, up to STDERR_LINE_MAX bytes
        extra = 0  # bytes of the current line beyond that
        while chunk := await stderr.read(READ_CHUNK):
            pieces = chunk.split(b"\n")
            for index, piece in enumerate(pieces):
                room = max(0, STDERR_LINE_MAX - len(head))
                head += piece[:room]
                extra += max(0, len(piece) - room)
                if index < len(pieces) - 1:  # a newline ends this piece
                    self._emit(bytes(head), extra)
                    head.clear()
                    extra = 0
        if head or extra:
            self._emit(bytes(head), extra)
        self._flush_suppressed()

    def _emit(self, line: bytes, extra: int) -> None:
        text = line.decode("utf-8", errors="replace").rstrip("\r")
        if extra:
            text += f" [... {extra} more bytes]"
        self.last = text
        now = time.monotonic()
        if now - self._window >= 1.0:
            self._flush_suppressed()
            self._window, self._logged = now, 0
        if self._logged >= STDERR_LINES_PER_SECOND:
            self._suppressed += 1
            return
        self._logged += 1
        logger.info("agent %s (pid %s): %s", self.connection_id, self.pid, text, extra=self._extra())

    def _flush_suppressed(self) -> None:
        if self._suppressed:
            logger.warning(
                "agent %s (pid %s): %d stderr lines not logged (more than %d a second)",
                self.connection_id,
                self.pid,
                self._suppressed,
                STDERR_LINES_PER_SECOND,
                extra=self._extra(),
            )
            self._suppressed = 0

    def _extra(self) -> dict[str, Any]:
        return {"acp_connection_id": self.connection_id, "agent_pid": self.pid}
