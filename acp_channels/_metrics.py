"""Prometheus metrics of one worker process (served at `/metrics` when ACP_CHANNELS["METRICS"]).

Every worker keeps and serves its own numbers: scrape every worker, not the balancer (an
`acp_worker_info{worker="<id>"}` sample names the worker a scrape came from).

What can be read from the registry when scraped (connections open, buffered bytes, agent
processes, draining) is collected then (acp_channels._metrics_collector), never updated per
message. This module imports nothing above the protocol rules: the host and the bus record here.
What happens (messages, cross-worker calls, streams opening and closing) is counted where it
happens with one call to a `record_*` function here: about 0.2 µs per message (a plain integer,
exposed when scraped), about 3 µs per cross-worker call (a counter and a histogram).

Metric objects live in prometheus_client's default registry, so a site that already exports
metrics of its own gets ours in the same exposition (and ours comes with the process and
garbage-collector metrics of the default registry).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal, ParamSpec, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from acp_channels._identity import TransportKind
from acp_channels._protocol import Batch, Frame

StreamKind = Literal["sse", "websocket"]

#: Seconds; cross-worker calls take about a millisecond on loopback; a `terminate` may wait for
#: an agent's shutdown grace.
CALL_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

STREAMS_OPEN: Final = Gauge(
    "acp_streams_open", "Streams this worker is writing now: SSE responses and attached WebSockets.", ["kind"]
)
CROSS_WORKER_CALLS: Final = Counter(
    "acp_cross_worker_calls",
    "Calls this worker made to other workers through the channel layer, by op and outcome "
    "(ok; refused: the other worker answered with an error; unreachable; busy; layer: the channel layer "
    "failed; cancelled: the caller went away; failed: anything else).",
    ["op", "outcome"],
)
CROSS_WORKER_CALL_SECONDS: Final = Histogram(
    "acp_cross_worker_call_seconds",
    "How long cross-worker calls took, by op.",
    ["op"],
    buckets=CALL_BUCKETS,
)

#: Messages counted as plain integers (everything that counts them runs on the event loop's
#: thread) and exposed when scraped: a prometheus_client increment takes a lock (~0.7 µs),
#: measurable per message; this is ~0.2 µs.
messages_in: Final[dict[str, int]] = {"http": 0, "websocket": 0}
messages_out: Final[dict[str, int]] = {"http": 0, "websocket": 0}
OUTPUT_REFUSED: Final = Counter(
    "acp_output_refused",
    "Agent messages refused for their size (over MAX_BODY_BYTES + 1 MiB, and over MAX_BUFFERED_BYTES): "
    "replaced by an error or a notice (docs/wire-contract.md §6.7).",
    ["transport"],
)
# Bound once: a label lookup costs more than the increment.
_STREAMS: Final[dict[str, Gauge]] = {kind: STREAMS_OPEN.labels(kind) for kind in ("sse", "websocket")}


def record_messages_in(transport: TransportKind, frame: Frame) -> None:
    """Client messages handed to an agent (a batch counts its entries)."""
    messages_in[transport] += len(frame.entries) if isinstance(frame, Batch) else 1


def record_messages_out(transport: TransportKind, frame: Frame) -> None:
    """Agent messages routed to a client (a batch counts its entries)."""
    messages_out[transport] += len(frame.entries) if isinstance(frame, Batch) else 1


def record_refused_output(transport: TransportKind) -> None:
    OUTPUT_REFUSED.labels(transport).inc()


def record_stream_opened(kind: StreamKind) -> None:
    _STREAMS[kind].inc()


def record_stream_closed(kind: StreamKind) -> None:
    _STREAMS[kind].dec()


_CALLS: dict[tuple[str, str], Counter] = {}
_CALL_SECONDS: dict[str, Histogram] = {}


def record_cross_worker_call(op: str, seconds: float, outcome: str) -> None:
    # Children cached: prometheus_client's labels() costs more than the increment itself.
    calls = _CALLS.get((op, outcome))
    if calls is None:
        calls = _CALLS[op, outcome] = CROSS_WORKER_CALLS.labels(op, outcome)
    latency = _CALL_SECONDS.get(op)
    if latency is None:
        latency = _CALL_SECONDS[op] = CROSS_WORKER_CALL_SECONDS.labels(op)
    calls.inc()
    latency.observe(seconds)


def call_outcome(error: BaseException | None, result: object, outcomes: dict[str, type[Any]]) -> str:
    """The `outcome` label of a cross-worker call that raised `error` or returned `result`:
    `outcomes` names the caller's own error classes (metrics knows no module above it), and
    `refused` the class of error replies."""
    if error is None:
        refused = outcomes.get("refused")
        return "refused" if refused is not None and isinstance(result, refused) else "ok"
    for outcome, kind in outcomes.items():
        if outcome != "refused" and isinstance(error, kind):
            return outcome
    return "failed" if isinstance(error, Exception) else "cancelled"


P = ParamSpec("P")
R = TypeVar("R")


def measured_call(
    **outcomes: type[Any],
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Decorates `Bus.call(self, worker_id, op, args, ...)`: counts and times every call, its
    errors labelled by `outcomes` (label=exception class), others `failed` or `cancelled`."""

    def decorate(call: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(call)
        async def measured(*args: P.args, **kwargs: P.kwargs) -> R:
            named = args[2] if len(args) > 2 else kwargs["op"]
            op = str(getattr(named, "name", named))  # a typed op names itself
            started = time.perf_counter()
            try:
                result = await call(*args, **kwargs)
            except BaseException as error:
                record_cross_worker_call(op, time.perf_counter() - started, call_outcome(error, None, outcomes))
                raise
            record_cross_worker_call(op, time.perf_counter() - started, call_outcome(None, result, outcomes))
            return result

        return measured

    return decorate


def exposition(accept: str | None, registry: CollectorRegistry = REGISTRY) -> tuple[bytes, str]:
    """Every metric, in the format the scraper's Accept header asks for (the Prometheus text
    format, or OpenMetrics), and its content type."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
