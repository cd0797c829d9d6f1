"""What the management commands and `/ready` need from the cluster, over the typed
cross-worker protocol (the listing and the administrative end are gateway.cluster_connections
and gateway.end_connection; this module adds what a process of its own must check first, and
the readiness round trip).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from acp_channels import _gateway as gateway
from acp_channels._inventory import ConnectionInfo
from acp_channels._worker import WORKER_ID, bus
from acp_channels._worker_protocol import Alive, Probe

T = TypeVar("T")


class ClusterUnreachable(Exception):
    """This process cannot reach other workers: an in-memory channel layer (one process), or
    a channel layer that failed."""


class WorkerDidNotAnswer(Exception):
    """The connection's worker is alive (heartbeat) but did not answer in time."""


def shared_layer() -> Any:
    """The channel layer, if it reaches other processes (a Redis layer); else ClusterUnreachable
    saying why (the management commands call it first: they run in a process of their own)."""
    if not bus.shared:
        raise ClusterUnreachable(
            "the channel layer is in-memory: it reaches no other process (configure a Redis channel layer, "
            "CHANNEL_LAYERS, as the workers use; see docs/several-workers.md)"
        )
    layer = bus.layer
    if not getattr(layer, "hosts", None):
        raise ClusterUnreachable(f"cannot find workers through {type(layer).__name__}: a Redis channel layer is needed")
    return layer


async def then_close(work: Awaitable[T]) -> T:
    """`work`, then this process's end of the cluster closed: a management command exits as
    soon as it is done (its inbox's blocking read would otherwise hold the loop's shutdown for
    up to the layer's block time)."""
    try:
        return await work
    finally:
        await bus.stop()


async def live_workers() -> list[str]:
    """The workers whose heartbeat is fresh (not this process unless it hosts connections)."""
    return await _from_heartbeats(bus.heartbeat.live_workers)


async def runner_loads() -> dict[str, dict[str, Any]]:
    """The live runners' published loads, by runner id (docs/runners.md); empty without runners."""
    return await _from_heartbeats(bus.heartbeat.runner_loads)


async def _from_heartbeats(read: Callable[[], Awaitable[T]]) -> T:
    """What `read` finds in the heartbeats' Redis keys; ClusterUnreachable when Redis fails."""
    shared_layer()
    bus.ensure_listening()
    try:
        return await read()
    except Exception as error:
        raise ClusterUnreachable(f"the channel layer's Redis did not answer: {error or type(error).__name__}") from None


async def cluster_connections(timeout: float | None = None) -> tuple[list[ConnectionInfo], list[str]]:
    """gateway.cluster_connections (`timeout` is the gateway's LIST_TIMEOUT)."""
    return await gateway.cluster_connections()


async def end_connection(connection_id: str) -> bool:
    """gateway.end_connection: False when no live worker hosts the connection."""
    return await gateway.end_connection(connection_id)


async def ping_self(timeout: float) -> None:
    """A round trip through the channel layer to this worker's own inbox and back (its inbox
    listener serves a Probe). Raises ClusterUnreachable with the reason when it fails."""
    if not bus.shared:
        return  # the in-memory layer lives in this process: nothing to reach
    try:
        async with asyncio.timeout(timeout):
            reply = await bus.call(WORKER_ID, Probe("ready"), timeout=timeout)
    except Exception as error:
        raise ClusterUnreachable(str(error) or type(error).__name__) from None
    if not isinstance(reply, Alive):
        raise ClusterUnreachable(f"unexpected reply {reply!r}")
