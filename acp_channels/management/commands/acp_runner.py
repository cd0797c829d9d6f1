"""`manage.py acp_runner`: a process that hosts agents for the web workers and serves no HTTP.

With `ACP_CHANNELS["AGENT_HOSTS"] = "runners"` the web workers place every new connection on a
live runner with room; run as many runners as the agents need, on this machine or others that
reach the same Redis (docs/runners.md). SIGTERM or Ctrl-C drains: no new connections, the
hosted ones go on for at most RUNNER_DRAIN_SECONDS, then the rest end.
"""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from acp_channels import _runner
from acp_channels._worker import bus


class Command(BaseCommand):
    help = "Host ACP agents for the web workers (AGENT_HOSTS = 'runners'); SIGTERM drains."

    def handle(self, *args: Any, **options: Any) -> None:
        if not bus.shared:
            raise CommandError(
                "a runner needs a channel layer the web workers share (CHANNEL_LAYERS on Redis): "
                "with the in-memory layer nothing could reach it"
            )
        asyncio.run(_runner.run(self.stderr.write))
