"""limits.ReadClocks: the request read clocks of a process share one timer (daphne's 408s)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from acp_channels._limits import CLOCK_SWEEP_SECONDS, ReadClocks


class Timers:
    """A stand-in for Twisted's callLater: records the calls, runs them when told."""

    def __init__(self) -> None:
        self.scheduled: list[tuple[float, Callable[..., Any], tuple[Any, ...]]] = []
        self.started = 0

    def call_later(self, seconds: float, function: Callable[..., Any], *args: Any) -> object:
        self.started += 1
        self.scheduled.append((seconds, function, args))
        return object()

    def run_due(self) -> None:
        due, self.scheduled = self.scheduled, []
        for _, function, args in due:
            function(*args)


class Connection:
    def __init__(self, deadline: float) -> None:
        self.clock_deadline = deadline
        self.expired = 0

    def clock_expired(self) -> None:
        self.expired += 1


def test_a_hundred_requests_start_one_timer() -> None:
    clocks, timers = ReadClocks(), Timers()
    connections = [Connection(time.monotonic() + 10) for _ in range(100)]
    for connection in connections:  # each request's headers, then its body: start, stop, start, stop
        clocks.start(connection, timers.call_later)
        clocks.stop(connection)
        clocks.start(connection, timers.call_later)
        clocks.stop(connection)
    assert timers.started == 1 and clocks.running == 0
    timers.run_due()  # the sweep finds nothing running: no further timer
    assert timers.scheduled == [] and not any(connection.expired for connection in connections)


def test_an_expired_clock_fires_once_at_the_next_sweep_and_the_others_wait() -> None:
    clocks, timers = ReadClocks(), Timers()
    late, waiting, stopped = Connection(time.monotonic() - 1), Connection(time.monotonic() + 60), Connection(0)
    for connection in (late, waiting, stopped):
        clocks.start(connection, timers.call_later)
    clocks.stop(stopped)
    assert [seconds for seconds, _, _ in timers.scheduled] == [CLOCK_SWEEP_SECONDS]
    timers.run_due()
    assert (late.expired, waiting.expired, stopped.expired) == (1, 0, 0)
    assert clocks.running == 1 and len(timers.scheduled) == 1  # still one clock running: one timer
    timers.run_due()
    assert late.expired == 1 and waiting.expired == 0
    waiting.clock_deadline = time.monotonic() - 1
    timers.run_due()
    assert waiting.expired == 1 and clocks.running == 0 and timers.scheduled == []
