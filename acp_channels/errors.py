"""The errors a connection's host raises, for the edges to answer (docs/wire-contract.md)."""

from __future__ import annotations

from typing import Literal


class StreamBusy(Exception):
    """The stream already has a reader (409), or the connection has no such stream."""


class ReplayUnavailable(Exception):
    """A reader asked to resume after an event the stream cannot replay from (409): `gone`
    (older than the replay window) or `foreign` (another stream's, or never sent)."""

    def __init__(self, reason: Literal["gone", "foreign"], event_id: str) -> None:
        self.reason = reason
        self.event_id = event_id
        if reason == "gone":
            text = f"Last-Event-ID {event_id} is older than the replay window of this stream; events were lost"
        else:
            text = f"Last-Event-ID {event_id} does not belong to this stream"
        super().__init__(text)


class AgentEnded(Exception):
    """The agent ended before it answered initialize."""


class ServerFull(Exception):
    """This worker takes no new connection now (503): it hosts MAX_CONNECTIONS, or it holds
    MAX_WORKER_BUFFERED_BYTES of undelivered output."""

    def __init__(self, reason: Literal["connections", "budget"]) -> None:
        super().__init__(reason)
        self.reason = reason


class QuotaExceeded(Exception):
    """The principal already holds MAX_CONNECTIONS_PER_PRINCIPAL connections on this worker (429)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


EndReason = Literal["delete", "idle", "socket closed", "agent ended", "shutdown", "initialize failed", "send failed"]


class TooManyStreams(Exception):
    """A reader asked for a session stream beyond MAX_SESSION_STREAMS (429)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


PendingUnit = Literal["requests", "bytes"]


class TooManyRequests(Exception):
    """A POST would put the connection over MAX_PENDING_REQUESTS (429), or the bytes of the
    requests waiting for the agent over MAX_BODY_BYTES (per connection) or
    MAX_WORKER_BUFFERED_BYTES (summed over the worker): `unit` says which. Nothing was forwarded."""

    def __init__(self, limit: int, unit: PendingUnit = "requests") -> None:
        super().__init__(limit, unit)
        self.limit = limit
        self.unit = unit
