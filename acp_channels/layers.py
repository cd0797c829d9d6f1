"""The channel layer for several workers and runners: Redis Streams through redis-py.

    CHANNEL_LAYERS = {"default": {
        "BACKEND": "acp_channels.layers.RedisChannelLayer",
        "CONFIG": {"hosts": ["redis://127.0.0.1:6379/0"], "channel_capacity": {"acp.worker.*": 10000}, ...},
    }}

`RedisChannelLayer` is `StreamsChannelLayer` (acp_channels._streams_layer): the whole Channels
layer interface with channels-redis's configuration (`hosts` with one Redis, `prefix`,
`expiry`, `group_expiry`, `capacity`, `channel_capacity`) plus `pool_size` and `pool_timeout`
(a redis-py connection pool that waits for a free connection under a burst instead of
failing). Usable by any Channels app; acp-channels routes every call between workers and
runners through it (docs/several-workers.md).
"""

from __future__ import annotations

from acp_channels._streams_layer import (
    DEFAULT_POOL_SIZE,
    DEFAULT_POOL_TIMEOUT,
    DEFAULT_SOCKET_TIMEOUT,
    StreamsChannelLayer,
    connection_pool,
)

__all__ = [
    "DEFAULT_POOL_SIZE",
    "DEFAULT_POOL_TIMEOUT",
    "DEFAULT_SOCKET_TIMEOUT",
    "RedisChannelLayer",
    "StreamsChannelLayer",
    "connection_pool",
]

#: The name sites configure (it was a channels-redis subclass before; same configuration).
RedisChannelLayer = StreamsChannelLayer
