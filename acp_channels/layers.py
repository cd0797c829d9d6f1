"""The channel layer for several workers: channels-redis with a connection pool that waits.

channels-redis gives each worker a redis-py `ConnectionPool` per Redis host. Every layer command
(a send is four: expire old messages, count, add, set the expiry) takes a connection from it for
its round trip, and redis-py (6 and later) opens at most 100 and raises `MaxConnectionsError`
for the next one. Under a burst (a thousand clients through three workers) a loaded worker has
more commands in flight than that: cross-worker calls failed (503) and stream pulls ended.

`RedisChannelLayer` here is the same layer with a `BlockingConnectionPool`: past `pool_size`
connections a command waits (up to `pool_timeout` seconds) for one to come back instead of
failing. Redis runs commands one at a time anyway, so more connections would not make a worker
faster, only open more sockets. Its replies may take DEFAULT_SOCKET_TIMEOUT to be read, not
redis-py's 5 s (see there). Configure it as channels-redis, plus two options:

    CHANNEL_LAYERS = {"default": {
        "BACKEND": "acp_channels.layers.RedisChannelLayer",
        "CONFIG": {"hosts": ["redis://127.0.0.1:6379/0"], "pool_size": 100, "pool_timeout": 20.0, ...},
    }}

A `max_connections` in a host entry (a dict, or `?max_connections=` in its URL) sets that host's
pool size instead. Sentinel hosts keep channels-redis's own pool.
"""

from __future__ import annotations

import time
from typing import Any, Final

from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer as _ChannelsRedisLayer
from redis.asyncio import BlockingConnectionPool

__all__ = ["DEFAULT_POOL_SIZE", "DEFAULT_POOL_TIMEOUT", "DEFAULT_SOCKET_TIMEOUT", "RedisChannelLayer", "blocking_pool"]

#: Connections one worker keeps to one Redis host (redis-py's own default cap).
DEFAULT_POOL_SIZE: Final = 100
#: How long a layer command waits for a free connection before it fails (503 for the request).
DEFAULT_POOL_TIMEOUT: Final = 20.0
#: How long a reply from Redis may take to be read. redis-py 8 defaults to 5 s, the very time a
#: channels-redis receive blocks in BZPOPMIN (`brpop_timeout`): a message Redis popped as that
#: timeout struck, or whose reply a busy worker read late, was lost with the dropped connection.
DEFAULT_SOCKET_TIMEOUT: Final = 30.0


def blocking_pool(host: dict[str, Any], size: int, timeout: float | None) -> BlockingConnectionPool:
    """A waiting pool for one channels-redis host entry (`{"address": url, ...}` or
    `{"host": ..., "port": ...}`); `max_connections` in the entry or its URL wins over `size`,
    and `socket_timeout` there over DEFAULT_SOCKET_TIMEOUT."""
    options = dict(host)
    size = int(options.pop("max_connections", size))
    options.setdefault("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
    if "address" in options:
        # from_url lets a `max_connections` in the URL's query win
        return BlockingConnectionPool.from_url(options.pop("address"), max_connections=size, timeout=timeout, **options)
    return BlockingConnectionPool(max_connections=size, timeout=timeout, **options)


#: channels-redis's send (drop expired messages, check the capacity, add, refresh the expiry)
#: as one script: one round trip instead of four. Returns 1 when the channel is full.
_SEND_SCRIPT: Final = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1])
if redis.call('ZCOUNT', KEYS[1], '-inf', '+inf') >= tonumber(ARGV[2]) then
    return 1
end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 0
"""


class RedisChannelLayer(_ChannelsRedisLayer):  # type: ignore[misc]
    """channels-redis whose commands wait for a free Redis connection under a burst, whose
    sends to ordinary channels take one round trip."""

    def __init__(
        self, *args: Any, pool_size: int = DEFAULT_POOL_SIZE, pool_timeout: float = DEFAULT_POOL_TIMEOUT, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.pool_size = pool_size
        self.pool_timeout = pool_timeout

    def create_pool(self, index: int) -> Any:
        host = self.hosts[index]
        if "master_name" in host:
            return super().create_pool(index)
        return blocking_pool(host, self.pool_size, self.pool_timeout)

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        """As channels-redis sends (same keys, format, capacity and expiry), in one round trip.
        Process-specific channels (with "!") keep channels-redis's own send."""
        if "!" in channel:
            await super().send(channel, message)
            return
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        assert "__asgi_channel__" not in message
        connection = self.connection(next(self._send_index_generator))
        now = time.time()
        full = await connection.eval(
            _SEND_SCRIPT,
            1,
            self.prefix + channel,
            int(now) - int(self.expiry),
            self.get_capacity(channel),
            self.serialize(message),
            now,
            int(self.expiry),
        )
        if full:
            raise ChannelFull()
