"""The metrics read from this worker's state when scraped (see acp_channels._metrics): the
connections the registry holds, the worker's output budget, its agent processes, whether it
drains, and the message counts kept as plain integers. Registered once on prometheus_client's
default registry (apps.ready imports this module), so any exposition of that registry has them.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from acp_channels import _metrics as metrics
from acp_channels._conf import acp_settings
from acp_channels._host import registry
from acp_channels._lifecycle import lifecycle
from acp_channels._worker import WORKER_ID


class ScrapeTimeCollector(Collector):
    """Gauges read from this process's registry when scraped (no cost between scrapes)."""

    def collect(self) -> Iterator[Metric]:
        yield InfoMetricFamily(
            "acp_worker", "The worker process these metrics come from (one per daphne process).", {"worker": WORKER_ID}
        )
        connections = GaugeMetricFamily(
            "acp_connections_open", "ACP connections this worker hosts now.", labels=["transport"]
        )
        hosts = list(registry)
        for transport in ("http", "websocket"):
            connections.add_metric([transport], sum(1 for host in hosts if host.transport == transport))
        yield connections
        for name, counts, direction in (
            ("acp_messages_in", metrics.messages_in, "from clients handed to agents"),
            ("acp_messages_out", metrics.messages_out, "from agents routed to clients"),
        ):
            family = CounterMetricFamily(
                name, f"JSON-RPC messages {direction} (batch entries counted).", labels=["transport"]
            )
            for transport, count in counts.items():
                family.add_metric([transport], count)
            yield family
        yield GaugeMetricFamily(
            "acp_buffered_bytes",
            "Undelivered agent output this worker holds for its readers (MAX_WORKER_BUFFERED_BYTES in use).",
            value=registry.budget.used,
        )
        yield GaugeMetricFamily(
            "acp_buffered_bytes_limit", "MAX_WORKER_BUFFERED_BYTES of this worker.", value=_worker_budget_limit()
        )
        yield GaugeMetricFamily(
            "acp_agent_processes",
            "Agent processes (stdio agents) serving this worker's connections now.",
            value=sum(1 for host in hosts if getattr(host.agent, "pid", None) is not None),
        )
        yield GaugeMetricFamily(
            "acp_draining",
            "1 while this worker shuts down (refuses new connections), else 0.",
            value=lifecycle.draining,
        )

    def describe(self) -> Iterator[Metric]:
        return iter(())  # nothing to check at registration: the names above are ours alone


def _worker_budget_limit() -> float:
    return acp_settings.MAX_WORKER_BUFFERED_BYTES


REGISTRY.register(ScrapeTimeCollector())
