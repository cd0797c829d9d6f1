"""`manage.py acp_connections [--json] [--timeout S]`: the live ACP connections of every worker
(and, with runners, each runner's load).

Runs in its own process and asks every live worker over the channel layer (see
acp_channels._cluster_admin). Exit status 0 when every live worker answered, 2 when some did not
(their connections are missing from the list: they are named), 1 when the cluster cannot be
reached at all (an in-memory channel layer, Redis down).
"""

from __future__ import annotations

import asyncio
import json
from argparse import ArgumentParser
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from acp_channels._cluster_admin import (
    ClusterUnreachable,
    cluster_connections,
    live_workers,
    runner_loads,
    shared_layer,
    then_close,
)
from acp_channels._inventory import ConnectionInfo
from acp_channels._worker import bus

RUNNER_COLUMNS = ("RUNNER", "CONNECTIONS", "AGENT PROCESSES", "STATE")
COLUMNS = ("CONNECTION", "WORKER", "PRINCIPAL", "TRANSPORT", "SESSIONS", "AGE", "IDLE", "BUFFERED", "AGENT PID")


class Command(BaseCommand):
    help = "List the live ACP connections of every worker (through the channel layer)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="one JSON object: connections, workers, silent workers")

    def handle(self, *args: Any, **options: Any) -> None:
        bus.hosts_connections = False  # a caller, not a worker: no heartbeat, never listed
        try:
            workers, connections, silent, runners = asyncio.run(then_close(_gather(None)))
        except ClusterUnreachable as error:
            raise CommandError(f"cannot reach the workers: {error}") from None
        if options["json"]:
            document = {
                "workers": workers,
                "silent_workers": silent,
                "runners": runners,
                "connections": [info.to_wire() for info in connections],
            }
            self.stdout.write(json.dumps(document, indent=2))
        else:
            if runners:
                self.stdout.write(render_runners(runners))
            self.stdout.write(render_table(connections))
            answered = len(workers) - len(silent)
            self.stdout.write(f"{len(connections)} connection(s) on {answered} of {len(workers)} live worker(s)")
        if silent:
            self.stderr.write(f"workers that did not answer (their connections are not listed): {', '.join(silent)}")
            raise SystemExit(2)


async def _gather(
    timeout: float | None,
) -> tuple[list[str], list[ConnectionInfo], list[str], dict[str, dict[str, Any]]]:
    shared_layer()  # an in-memory layer: this process is alone, say so
    connections, silent = await cluster_connections(timeout)
    # Scanned again for the workers that answered with no connection; those seen above count
    # even if they stopped meanwhile.
    workers = set(await live_workers()) | set(silent) | {info.worker for info in connections}
    runners = {
        runner: {key: load.get(key) for key in ("connections", "stdio_agents", "room", "draining")}
        for runner, load in (await runner_loads()).items()
    }
    return sorted(workers), connections, silent, runners


def render_runners(runners: dict[str, dict[str, Any]]) -> str:
    """The runners and the load each last published (AGENT_HOSTS "runners")."""
    rows = [RUNNER_COLUMNS] + [
        (
            runner,
            str(load["connections"]),
            str(load["stdio_agents"]),
            "draining" if load["draining"] else "room" if load["room"] else "full",
        )
        for runner, load in sorted(runners.items())
    ]
    return _columns(rows) + "\n"


def render_table(connections: list[ConnectionInfo]) -> str:
    rows = [COLUMNS] + [
        (
            info.connection_id,
            info.worker,
            info.principal,
            info.transport,
            str(info.sessions),
            duration(info.age_seconds),
            duration(info.idle_seconds),
            size(info.buffered_bytes),
            "-" if info.agent_pid is None else str(info.agent_pid),
        )
        for info in connections
    ]
    return _columns(rows)


def _columns(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def duration(seconds: float) -> str:
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.1f}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole // 60 % 60:02d}m"


def size(count: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"
