"""Experiment, not a recommended deployment: the demo application with the WebSocket consumer
detached from the channel layer (`AcpWebsocketConsumer.channel_layer_alias = None`, patched at
import; the consumer talks to its host directly and never uses its layer channel).

With channels-redis, every AsyncWebsocketConsumer otherwise keeps a blocking receive on its own
layer channel; a redis-py read timeout there escapes channels' dispatch loop and closes the
socket mid-session. `python -m bench.run --servers ours-3w-redis-wsfix --no-fanout` runs the
cluster with the patch.
"""

from __future__ import annotations

from acp_channels._consumers import AcpWebsocketConsumer
from demo_project.asgi import application

AcpWebsocketConsumer.channel_layer_alias = None  # type: ignore[assignment]

__all__ = ["application"]
