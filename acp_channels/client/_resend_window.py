"""The messages a WebSocket transport sent, numbered and kept so that a reattach can send again
the ones the server did not get (docs/resumable-streams.md): the last `max_messages` (at most
`max_bytes`, but always the last one)."""

from __future__ import annotations

import collections

from ._errors import ProtocolViolationError, ResumeFailedError

__all__ = ["ResendWindow"]


class ResendWindow:
    """Messages sent on one connection, the last ones kept to send again."""

    def __init__(self, max_messages: int, max_bytes: int) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        #: Messages sent on this connection (the number of the last one).
        self.sent_count = 0
        self._kept: collections.deque[tuple[int, str]] = collections.deque()
        self._kept_bytes = 0

    def keep(self, text: str) -> None:
        """Number `text` as the next message sent and keep it; the oldest beyond the bounds go."""
        self.sent_count += 1
        self._kept.append((self.sent_count, text))
        self._kept_bytes += len(text)
        while len(self._kept) > 1 and (len(self._kept) > self.max_messages or self._kept_bytes > self.max_bytes):
            _, oldest = self._kept.popleft()
            self._kept_bytes -= len(oldest)

    def after(self, received: int) -> list[str]:
        """The messages to send again to a server that `received` the first ones (those are
        forgotten). Raises when the server claims more than was sent, or when messages it
        missed are no longer kept (they were lost)."""
        oldest = self._kept[0][0] if self._kept else self.sent_count + 1
        if received > self.sent_count:
            raise ProtocolViolationError(
                f"WebSocket reattach: the server says it received {received} messages; {self.sent_count} were sent"
            )
        if received + 1 < oldest:
            raise ResumeFailedError(
                f"WebSocket reattach: the server received {received} of our {self.sent_count} messages, and "
                f"messages {received + 1}-{oldest - 1} are no longer kept to send again (the resend window is "
                f"{self.max_messages} messages / {self.max_bytes} bytes); they were lost"
            )
        while self._kept and self._kept[0][0] <= received:
            _, text = self._kept.popleft()
            self._kept_bytes -= len(text)
        return [text for _, text in self._kept]

    def clear(self) -> None:
        """A new connection: nothing sent yet."""
        self.sent_count = self._kept_bytes = 0
        self._kept.clear()
