"""`manage.py acp_end_connection <connection id>`: end one ACP connection, on whichever worker
hosts it, as a DELETE would (its agent shut down, its streams end, later requests get 404).

Exit status 0 when it was ended; 1 with a message for an id no live worker hosts, a worker that
did not answer, or a cluster that cannot be reached.
"""

from __future__ import annotations

import asyncio
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from acp_channels._cluster_admin import (
    ClusterUnreachable,
    WorkerDidNotAnswer,
    end_connection,
    shared_layer,
    then_close,
)
from acp_channels._worker import bus


class Command(BaseCommand):
    help = "End one ACP connection by id, on whichever worker hosts it."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("connection_id", help="as listed by acp_connections (the Acp-Connection-Id)")

    def handle(self, *args: Any, **options: Any) -> None:
        bus.hosts_connections = False  # a caller, not a worker: no heartbeat, never listed
        connection_id: str = options["connection_id"]
        try:
            shared_layer()  # an in-memory layer: this process is alone, say so
            ended = asyncio.run(then_close(end_connection(connection_id)))
        except (ClusterUnreachable, WorkerDidNotAnswer) as error:
            raise CommandError(f"could not end {connection_id}: {error}") from None
        if not ended:
            raise CommandError(f"no live worker hosts a connection {connection_id}")
        self.stdout.write(f"ended {connection_id}")
