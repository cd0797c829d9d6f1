"""Reconnecting a dropped SSE stream or WebSocket without losing or repeating a message
(docs/resumable-streams.md), and what both transports share for it:

* `Backoff`, the default `ReconnectPolicy`: exponential delays, then a fatal error after a
  bounded time since the drop;
* `ReconnectEvent`, what `HttpClient(on_reconnect=...)` is told (reconnecting, resumed,
  restarted, gave up), so a terminal or a log can say so.

What a restart needs to know (`SessionLedger`) is in session_ledger.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from .errors import TransportError

__all__ = [
    "DEFAULT_BACKOFF",
    "Backoff",
    "ReconnectCallback",
    "ReconnectEvent",
    "ReconnectPolicy",
    "StreamDrop",
]


@dataclass(frozen=True, slots=True)
class StreamDrop:
    """A stream (SSE) or socket (WebSocket) that was established has ended or broken."""

    session_id: str | None
    """The session of an SSE stream; None for the connection stream and for a WebSocket."""
    attempt: int
    """1 for the first retry since the stream was last (re)established."""
    error: TransportError
    """Why it ended, or why the last retry failed."""
    last_event_id: str | None
    """What the retry sends as `Last-Event-ID` (SSE: the last event id; WebSocket: the count of
    messages received)."""
    elapsed: float = 0.0
    """Seconds since the stream dropped (since the first failure after it was established)."""
    what: str = ""
    """The stream in words: "connection stream", "session stream 's1'", "WebSocket"."""


#: Decides whether to retry: seconds to wait before the retry, or None to give up (fatal).
ReconnectPolicy: TypeAlias = Callable[[StreamDrop], float | None]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry at once, then after `initial` seconds, doubling up to `maximum`, until
    `give_up_after` seconds have passed since the drop (then the drop is fatal).

    An attempt under way is not cut short by the deadline: each is bounded by the client's
    `timeout`, so the client gives up at most `give_up_after + timeout` after the drop.
    `jitter` spreads retries of many clients (a delay is shortened by up to that fraction)."""

    initial: float = 0.1
    maximum: float = 5.0
    give_up_after: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < 0 or self.give_up_after < 0:
            raise ValueError("Backoff: delays and give_up_after must not be negative")
        if self.multiplier < 1 or not 0 <= self.jitter <= 1:
            raise ValueError("Backoff: multiplier >= 1 and 0 <= jitter <= 1")

    def delay(self, attempt: int) -> float:
        """The delay before retry number `attempt` (1: at once), without jitter."""
        if attempt <= 1:
            return 0.0
        return float(min(self.maximum, self.initial * self.multiplier ** (attempt - 2)))

    def __call__(self, drop: StreamDrop) -> float | None:
        remaining = self.give_up_after - drop.elapsed
        if remaining <= 0:
            return None
        delay = self.delay(drop.attempt)
        if self.jitter and delay:
            delay *= 1 - random.random() * self.jitter
        return min(delay, remaining)


#: The policy `HttpClient` uses unless told otherwise.
DEFAULT_BACKOFF: Final = Backoff()

ReconnectKind: TypeAlias = Literal["reconnecting", "resumed", "restarted", "gave-up"]


@dataclass(frozen=True, slots=True)
class ReconnectEvent:
    """Something `HttpClient` did about a dropped stream or socket.

    * "reconnecting": `what` dropped (`error`); retry number `attempt` follows after `delay` s.
    * "resumed": `what` is back; nothing was lost or repeated.
    * "restarted": the server had forgotten the connection; a new one (`connection_id`, the
      old one in `previous_connection_id`) was initialized with the same params and the
      sessions in `sessions_loaded` were `session/load`ed (`sessions_lost`: the ones that
      could not be, with why). Messages the agent sent after the drop were lost, and every
      request still unanswered was answered with an error (`requests_failed` of them).
    * "gave-up": the drop is fatal (`error` is what the transport now fails with).
    """

    kind: ReconnectKind
    what: str
    error: TransportError | None = None
    attempt: int = 0
    delay: float = 0.0
    connection_id: str | None = None
    previous_connection_id: str | None = None
    sessions_loaded: tuple[str, ...] = ()
    sessions_lost: tuple[tuple[str, str], ...] = ()
    requests_failed: int = 0

    def __str__(self) -> str:
        if self.kind == "reconnecting":
            when = f" in {self.delay:.2g}s" if self.delay else ""
            return f"reconnecting… ({self.what}, attempt {self.attempt}{when}): {self.error}"
        if self.kind == "resumed":
            return f"resumed the {self.what}: nothing lost"
        if self.kind == "restarted":
            loaded = ", ".join(self.sessions_loaded) or "none"
            lost = "; ".join(f"{session}: {why}" for session, why in self.sessions_lost)
            return (
                f"restarted: connection {self.previous_connection_id} was gone, now {self.connection_id}; "
                f"sessions loaded: {loaded}"
                + (f"; not loaded: {lost}" if lost else "")
                + f"; {self.requests_failed} unanswered requests failed; messages after the drop were lost"
            )
        return f"gave up on the {self.what}: {self.error}"


ReconnectCallback: TypeAlias = Callable[[ReconnectEvent], None]


def event_position(event_id: str) -> tuple[str, int] | None:
    """(tag, seq) of an SSE id of our server's form `<tag>-<seq>`; None for any other id (then
    it is only echoed back, never compared)."""
    tag, dash, seq = event_id.rpartition("-")
    if not dash or not seq.isascii() or not seq.isdigit():
        return None
    return tag, int(seq)


def gone_detail(connection_id: str | None, refusal: str) -> str:
    """Why a 404 to a resume is fatal, for `ResumeRefusedError`."""
    return f"connection {connection_id} is gone on the server (ended, or forgotten); not restarting: {refusal}"
