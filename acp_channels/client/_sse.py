"""An incremental Server-Sent Events parser (the WHATWG event-stream rules), bytes in, events out.

It accepts LF, CRLF and CR line ends (also split across chunks), joins multi-line `data`, keeps
`id` (for `Last-Event-ID`), skips comments, and refuses events larger than a limit. Lines are
found with one regex scan from where the last one ended, so a 16 MiB event arriving in small
chunks costs linear time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["SseEvent", "SseParser", "SseTooLarge"]

_LINE_END: Final = re.compile(rb"\r\n|\r|\n")
_BOM: Final = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event. `data` is "" for an event that only carried an `id`."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None
    has_id_field: bool = False
    """The event had its own `id:` line (`id` otherwise is the one that persists from before)."""


class SseTooLarge(ValueError):
    """An event (or a line without an end) grew beyond the parser's limit."""


class SseParser:
    def __init__(self, max_event_size: int = 64 * 1024 * 1024) -> None:
        self.max_event_size = max_event_size
        self._buffer = bytearray()
        self._scan_from = 0
        self._started = False
        self._after_cr = False
        self._data: list[str] = []
        self._data_size = 0
        self._event = ""
        self._id: str | None = None
        self._id_seen = False
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Add bytes; return the events they complete."""
        if not chunk:
            return []
        if self._after_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]  # the LF of a CRLF split across chunks
        self._after_cr = False
        self._buffer += chunk
        if not self._started:
            if len(self._buffer) < len(_BOM) and _BOM.startswith(bytes(self._buffer)):
                return []
            if self._buffer.startswith(_BOM):
                del self._buffer[: len(_BOM)]
            self._started = True
        events: list[SseEvent] = []
        start = 0
        buffer = self._buffer
        position = max(self._scan_from, 0)
        while True:
            match = _LINE_END.search(buffer, position)
            if match is None:
                break
            if match.group() == b"\r" and match.end() == len(buffer):
                # A lone CR at the end: a line end either way, but the next chunk may start
                # with the LF that completes a CRLF.
                self._after_cr = True
            event = self._line(bytes(buffer[start : match.start()]))
            if event is not None:
                events.append(event)
            start = position = match.end()
        del buffer[:start]
        self._scan_from = len(buffer)
        if len(buffer) + self._data_size > self.max_event_size:
            raise SseTooLarge(f"SSE event larger than {self.max_event_size} bytes")
        return events

    def _line(self, raw: bytes) -> SseEvent | None:
        if not raw:
            return self._dispatch()
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._data_size += len(raw)
            if self._data_size > self.max_event_size:
                raise SseTooLarge(f"SSE event larger than {self.max_event_size} bytes")
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
                self._id_seen = True
        elif name == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        return None

    def _dispatch(self) -> SseEvent | None:
        data, event, event_id, id_seen, retry = self._data, self._event, self._id, self._id_seen, self._retry
        self._data, self._data_size, self._event, self._id_seen, self._retry = [], 0, "", False, None
        if not data and not id_seen and retry is None:
            return None
        # The last event id persists across events (it is the stream's, per the standard).
        return SseEvent("\n".join(data), event or "message", event_id, retry, id_seen)
