"""Honouring `Retry-After`: a server that answers 503 or 429 with it says "nothing was done, try
again then" (acp-channels does so when a worker is full, draining or too busy to take a call).

`RetryAfter` is the policy `HttpClient` applies to `initialize`, every POST and every stream
GET: wait the delay the server gave (at most `max_delay`), send the same request again, and give
up (the status is then fatal, as without the policy) once `deadline` seconds have passed since
the first answer. Each wait is logged and handed to `on_retry` as a `RetryEvent`.
"""

from __future__ import annotations

import datetime
import email.utils
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias

__all__ = ["DEFAULT_RETRY_AFTER", "RETRY_STATUSES", "RetryAfter", "RetryCallback", "RetryEvent", "retry_after_seconds"]

#: The statuses whose Retry-After is honoured.
RETRY_STATUSES: Final = frozenset({429, 503})


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """Retry a 503 or 429 that carries `Retry-After` after the delay it gives.

    `max_delay`: a longer delay is shortened to this (a server asking for minutes is still
    tried again soon). `deadline`: the time one request may spend retrying, from its first
    refusal; a retry that would start later is not made and the refusal is final."""

    max_delay: float = 10.0
    deadline: float = 60.0

    def __post_init__(self) -> None:
        if not (self.max_delay >= 0 and self.deadline >= 0):
            raise ValueError("RetryAfter: max_delay and deadline must not be negative")

    def delay(self, retry_after: float, elapsed: float) -> float | None:
        """Seconds to wait before the next attempt, or None to give up."""
        wait = min(max(retry_after, 0.0), self.max_delay)
        return None if elapsed + wait > self.deadline else wait


#: The policy `HttpClient` uses unless told otherwise (`retry_after=None` turns it off).
DEFAULT_RETRY_AFTER: Final = RetryAfter()


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """`HttpClient` got `status` with Retry-After for `what` and sends it again after `delay` s
    (`attempt` 1 for the first retry; `elapsed` seconds since the first refusal)."""

    what: str
    status: int
    delay: float
    attempt: int
    elapsed: float
    body: str = ""

    def __str__(self) -> str:
        said = f": {self.body.strip()}" if self.body.strip() else ""
        return f"{self.what}: HTTP {self.status}{said}; retrying in {self.delay:.2g}s (attempt {self.attempt})"


RetryCallback: TypeAlias = Callable[[RetryEvent], None]


def retry_after_seconds(status: int, headers: Mapping[str, str]) -> float | None:
    """The delay a 429/503 asks for (delta-seconds or an HTTP date), or None: another status,
    no Retry-After, or one that cannot be read."""
    if status not in RETRY_STATUSES:
        return None
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    seconds = (when - datetime.datetime.now(datetime.UTC)).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None
