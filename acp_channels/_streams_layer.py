"""A Channels layer on Redis Streams, through redis-py's asyncio client.

The whole Channels layer interface (`send`, `receive`, `new_channel`, `group_add`,
`group_discard`, `group_send`, `flush`) with channels-redis's configuration and behaviours
(capacity, per-channel capacity, message expiry, group expiry), on one Redis:

- A channel is a stream, `<prefix>c:<name>`. Every send is one script call (the same as a
  group_send's): refuse past the capacity (ChannelFull) once a full stream's entries older than
  `expiry` are dropped (XTRIM MINID, on Redis's clock; readers skip expired entries), XADD, and
  let the key expire when nobody sends. An entry holds
  the message (msgpack) and, for a process-specific channel, the channel's name.
- An ordinary channel may have receivers in several processes and each message goes to one of
  them: they read through one consumer group (XREADGROUP), then acknowledge and delete what they
  took, so the stream's length is what waits.
- The process-specific channels of one layer instance (`new_channel`: `<prefix>.<client>!<id>`,
  whatever their prefix) share one stream, `<prefix>p:<client>`, read by that instance alone
  (XREAD from its last id) and sorted into per-channel buffers; their capacity is that stream's.
- Reads run as tasks of their own that receives wait for without owning them: a cancelled
  receive leaves its read going, and what it reads waits in the channel's buffer for the next
  receive (redis-py can swallow a cancel that lands in a blocking read).
- A group is a sorted set of its channels by the time they joined (`group_expiry`); group_send
  adds the message to every member's stream in one script call. Members over capacity are
  skipped, as the Channels spec allows, and counted in a WARNING line: nothing is dropped
  without a word. A buffer of a process-specific channel holds at most its capacity; past it the
  oldest message is dropped, with a WARNING.

Redis clients are per event loop (redis-py's connections belong to the loop that made them), so
the layer works under `async_to_sync` as well; each is a pool of `pool_size` connections that
waits up to `pool_timeout` for a free one. acp-channels routes every call between workers and
runners through it: a worker's inbox is a process-specific channel named after the worker
(`name_this_process`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import time
import weakref
from typing import Any, Final

import msgpack
from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

__all__ = ["StreamsChannelLayer"]

logger = logging.getLogger("acp_channels.layers")

#: Connections one process keeps to Redis (redis-py's usual cap), and how long a command waits
#: for a free one before it fails (the request then gets 503).
DEFAULT_POOL_SIZE: Final = 100
DEFAULT_POOL_TIMEOUT: Final = 20.0
#: How long a reply from Redis may take to be read: longer than a blocking read (BLOCK_MS).
DEFAULT_SOCKET_TIMEOUT: Final = 30.0
#: The consumer group every receiver of an ordinary channel reads through.
RECEIVERS: Final = "receivers"
#: An entry of an ordinary channel read by a consumer and not acknowledged for this long is
#: taken over by another (the reader died between its read and its acknowledgement).
CLAIM_IDLE_MS: Final = 10_000
#: A process's own stream: what its reads took is deleted once this many entries were read.
DELETE_EVERY: Final = 32
#: Channels whose capacity a layer remembers (then it starts over).
CAPACITIES_REMEMBERED: Final = 4096
#: How long one blocking read waits before it is issued again (a dropped connection or a stream
#: that expired is then noticed); below the socket timeout.
BLOCK_MS: Final = 5000

#: Adds a message to channels' streams (one for a send, each member's for a group_send): skips a
#: stream at its capacity once the entries older than the expiry (on Redis's clock) are dropped,
#: sets the key's expiry. Only a full stream is trimmed: readers skip expired entries anyway, and
#: the trim and the clock are two of the five commands a send would otherwise cost Redis. KEYS:
#: the streams; ARGV: expiry ms, key ttl ms, message, then per channel its name, whether it is
#: process-specific (1/0) and its capacity. Returns the channels that were full.
_ADD: Final = """
local now_ms = nil
local full = {}
for i, stream in ipairs(KEYS) do
    local channel, specific, capacity = ARGV[1 + i * 3], ARGV[2 + i * 3], tonumber(ARGV[3 + i * 3])
    local length = redis.call('XLEN', stream)
    if length >= capacity then
        if now_ms == nil then
            local now = redis.call('TIME')
            now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
        end
        redis.call('XTRIM', stream, 'MINID', now_ms - tonumber(ARGV[1]))
        length = redis.call('XLEN', stream)
    end
    if length >= capacity then
        table.insert(full, channel)
    else
        if specific == '1' then
            redis.call('XADD', stream, '*', 'm', ARGV[3], 'c', channel)
        else
            redis.call('XADD', stream, '*', 'm', ARGV[3])
        end
        redis.call('PEXPIRE', stream, ARGV[2])
    end
end
return full
"""


def connection_pool(host: str | dict[str, Any], size: int, timeout: float | None) -> Any:
    """A redis-py connection pool for one host entry (a URL, `{"address": url, ...}` or a dict of
    connection arguments; Sentinel: `{"sentinels": [(host, port)...], "master_name": ...,
    "sentinel_kwargs": {...}}`) that waits up to `timeout` for a free connection past `size`
    (`max_connections` in the entry or its URL wins); replies may take DEFAULT_SOCKET_TIMEOUT
    unless the entry says otherwise."""
    from redis.asyncio import BlockingConnectionPool
    from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

    options: dict[str, Any] = {"address": host} if isinstance(host, str) else dict(host)
    size = int(options.pop("max_connections", size))
    options.setdefault("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
    if "master_name" in options:
        sentinel = Sentinel(options.pop("sentinels"), sentinel_kwargs=options.pop("sentinel_kwargs", None))
        master = options.pop("master_name")
        return SentinelConnectionPool(master, sentinel, max_connections=size, **options)  # type: ignore[no-untyped-call]
    if "address" in options:
        return BlockingConnectionPool.from_url(options.pop("address"), max_connections=size, timeout=timeout, **options)
    return BlockingConnectionPool(max_connections=size, timeout=timeout, **options)


def _own_entries(reply: Any) -> list[Any]:
    """The entries of an XREAD of one stream as Redis sent it: a map of the stream to its
    entries (RESP3) or a list of [stream, entries] (RESP2); none on a timeout. An entry is
    [id, [field, value, ...]]."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return next(iter(reply.values()))
    return reply[0][1]  # type: ignore[no-any-return]


def _client_of(channel: str) -> str:
    """The client part of a process-specific channel name (`<prefix>.<client>!<id>`)."""
    return channel[: channel.index("!")].rpartition(".")[2]


class StreamsChannelLayer(BaseChannelLayer):  # type: ignore[misc]
    """A Channels layer on Redis Streams (see the module docstring). Configured as
    channels-redis is, with one host: `hosts` (a URL, or a dict of redis-py connection
    arguments, or `{"address": url, ...}`), `prefix`, `expiry`, `group_expiry`, `capacity`,
    `channel_capacity`."""

    extensions = ["groups", "flush"]

    def __init__(
        self,
        hosts: list[str | dict[str, Any]] | None = None,
        prefix: str = "asgi",
        expiry: float = 60,
        group_expiry: int = 86400,
        capacity: int = 100,
        channel_capacity: dict[str, int] | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
        pool_timeout: float | None = DEFAULT_POOL_TIMEOUT,
    ) -> None:
        super().__init__(expiry=expiry, capacity=capacity)
        self.channel_capacity = self.compile_capacities(channel_capacity or {})
        hosts = hosts or ["redis://127.0.0.1:6379"]
        if len(hosts) != 1:
            raise ValueError("StreamsChannelLayer takes one Redis host (no sharding)")
        self.host = hosts[0]
        self.pool_size = pool_size
        self.pool_timeout = pool_timeout
        self.prefix = prefix
        self.key_prefix = f"{prefix}:"
        self.group_expiry = group_expiry
        self.client_prefix = secrets.token_hex(6)
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Redis] = weakref.WeakKeyDictionary()
        #: Per event loop, the connection that reads this instance's own stream, held (its reads
        #: follow each other): through the pool each read paid more for taking and giving back a
        #: connection, redis-py's parsing of entries into dicts and its instrumentation than itself.
        self._own_connections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        self._scripts: weakref.WeakKeyDictionary[Redis, AsyncScript] = weakref.WeakKeyDictionary()
        self._last_client: tuple[asyncio.AbstractEventLoop, Redis] | None = None
        self._capacities: dict[str, int] = {}
        #: Entries of this instance's own stream read and not yet deleted (deleted with the next read).
        self._read_ids: list[bytes] = []
        #: Ordinary channels' streams whose next read takes this consumer's pending entries first.
        self._recheck: dict[str, bool] = {}
        #: Entries of ordinary channels in a buffer whose acknowledgement has not landed yet.
        self._buffered: set[tuple[str, bytes]] = set()
        self._consumer = f"{self.client_prefix}-{secrets.token_hex(4)}"
        # process-specific channels: what was read for each, and where the shared stream was read up to
        self._buffers: dict[str, collections.deque[dict[str, Any]]] = collections.defaultdict(collections.deque)
        self._last_id = "0-0"
        #: the read running for each stream, per event loop
        self._readers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Task[None]]] = (
            weakref.WeakKeyDictionary()
        )

    # -- connections ---------------------------------------------------------------------------

    @property
    def hosts(self) -> list[dict[str, Any]]:
        """The Redis host entry as a list of one dict (channels-redis's shape, which the
        heartbeat reads)."""
        return [{"address": self.host} if isinstance(self.host, str) else dict(self.host)]

    def name_this_process(self, name: str) -> None:
        """Give this instance's process-specific channels a client name others know (a worker
        id) instead of a random one: `<prefix>.<name>!<id>` then reaches this process from
        any other. Call before the first receive."""
        assert name and self.require_valid_channel_name(name) and "." not in name, name
        self.client_prefix = name
        self._consumer = f"{name}-{secrets.token_hex(4)}"

    def _client(self) -> Redis:
        loop = asyncio.get_running_loop()
        last = self._last_client
        if last is not None and last[0] is loop:
            return last[1]  # the usual case, without a weak dictionary's lookup per command
        client = self._clients.get(loop)
        if client is None:
            pool = connection_pool(self.host, self.pool_size, self.pool_timeout)
            client = self._clients[loop] = Redis(connection_pool=pool)
            self._scripts[client] = client.register_script(_ADD)
        self._last_client = (loop, client)
        return client

    def _capacity(self, channel: str) -> int:
        """`get_capacity` (a match against every pattern), remembered per channel."""
        capacity = self._capacities.get(channel)
        if capacity is None:
            if len(self._capacities) >= CAPACITIES_REMEMBERED:
                self._capacities.clear()
            capacity = self._capacities[channel] = self.get_capacity(channel)
        return capacity

    async def _own_connection(self) -> Any:
        loop = asyncio.get_running_loop()
        connection = self._own_connections.get(loop)
        if connection is None:
            pool = self._client().connection_pool
            connection = self._own_connections[loop] = await pool.get_connection()  # type: ignore[no-untyped-call]
        return connection

    def redis(self) -> Redis:
        """This event loop's redis-py client on the layer's Redis (for structures of the site
        kept next to the layer's, such as acp-channels' output journals; keys under
        `key_prefix`)."""
        return self._client()

    async def close_pools(self) -> None:
        """Close this event loop's connections (channels-redis's name for it), ending its reads
        at once: a blocking read may not see its cancellation until BLOCK_MS is over (redis-py
        can swallow it), so its connection is closed under it."""
        loop = asyncio.get_running_loop()
        readers = [reader for reader in self._readers.pop(loop, {}).values() if not reader.done()]
        for reader in readers:
            reader.cancel()
        client = self._clients.pop(loop, None)
        self._own_connections.pop(loop, None)
        self._last_client = None
        if client is not None:
            await client.connection_pool.disconnect()  # the connections in use too (a held read's)
        if readers:
            await asyncio.wait(readers)
            for reader in readers:
                if not reader.cancelled():
                    reader.exception()  # its connection closed under it: expected, and seen
        if client is not None:
            await client.aclose()

    close = close_pools

    # -- names ---------------------------------------------------------------------------------

    def _stream(self, channel: str) -> str:
        """The stream of a channel: its own, or for a process-specific one (`<prefix>.<client>!<id>`)
        its client's, whatever its prefix."""
        if "!" in channel:
            return f"{self.key_prefix}p:{_client_of(channel)}"
        return f"{self.key_prefix}c:{channel}"

    def _own(self, channel: str) -> bool:
        return "!" in channel and _client_of(channel) == self.client_prefix

    async def new_channel(self, prefix: str = "specific") -> str:
        return f"{prefix}.{self.client_prefix}!{secrets.token_hex(8)}"

    # -- sending -------------------------------------------------------------------------------

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        """Add `message` to `channel`; ChannelFull when it holds its capacity."""
        assert isinstance(message, dict), "message is not a dict"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        assert "__asgi_channel__" not in message
        if await self._add([channel], message):
            raise ChannelFull(channel)

    async def _add(self, channels: list[str], message: dict[str, Any]) -> list[bytes]:
        """`message` added to each channel's stream in one script call; the channels at their
        capacity, which got nothing."""
        arguments: list[Any] = []
        for channel in channels:
            arguments += [channel, int("!" in channel), self._capacity(channel)]
        client = self._client()
        keys = [self._stream(channel) for channel in channels]
        values = [int(self.expiry * 1000), self._ttl_ms(), msgpack.packb(message, use_bin_type=True), *arguments]
        full: list[bytes] = await self._scripts[client](keys, values)  # EVALSHA (the script loads once)
        return full

    def _ttl_ms(self) -> int:
        return int(self.expiry * 1000) + 1000

    # -- receiving -----------------------------------------------------------------------------

    async def receive(self, channel: str) -> dict[str, Any]:
        """The next message of `channel`, waiting for one.

        Reads are tasks of their own that a receive waits for without owning: a cancelled
        receive leaves its read running, and what it reads waits in this process's buffer of
        the channel for the next receive (redis-py may swallow a cancel that comes during a
        blocking read, so a read is never the cancelled thing)."""
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        if "!" in channel:
            assert self._own(channel), "Wrong client prefix"
        loop = asyncio.get_running_loop()
        stream = self._stream(channel)
        readers = self._readers.setdefault(loop, {})
        while True:
            buffer = self._buffers.get(channel)
            if buffer:
                message = buffer.popleft()
                if not buffer:
                    del self._buffers[channel]
                return message
            reader = readers.get(stream)
            if reader is None or reader.done():
                read = self._read_own_stream(stream, channel) if "!" in channel else self._read_shared(stream, channel)
                reader = readers[stream] = loop.create_task(read, name=f"acp-layer-read {stream}")
            await asyncio.shield(reader)

    async def _read_shared(self, stream: str, channel: str) -> None:
        """Take at most one message of an ordinary channel (through the receivers' group) into
        its buffer.

        At least once, never twice: an entry is acknowledged (and deleted) after it is in the
        buffer. A read or an acknowledgement that failed (a cut connection) leaves the entry in
        this consumer's pending list, which the next read takes first, skipping what was already
        buffered; once that list is empty, entries a vanished consumer left pending longer than
        CLAIM_IDLE_MS are claimed (XAUTOCLAIM), as they are whenever a blocking read comes back
        empty."""
        client = self._client()
        pending = self._recheck.get(stream, True)
        try:
            if pending:
                reply: Any = await client.xreadgroup(RECEIVERS, self._consumer, {stream: "0"}, count=1)
            else:
                reply = await client.xreadgroup(RECEIVERS, self._consumer, {stream: ">"}, count=1, block=BLOCK_MS)
        except ResponseError as error:
            # no group yet, or the stream expired (nobody sent for a while) under a reader
            if "NOGROUP" not in str(error) and "no longer exists" not in str(error):
                raise
            await self._create_group(client, stream)
            return
        except BaseException:
            self._recheck[stream] = True  # the reply may be lost with the entry in it
            raise
        entries = reply[0][1] if reply else []
        if not entries:
            self._recheck[stream] = await self._claim_abandoned(client, stream)
            return
        entry_id, fields = entries[0]
        self._recheck[stream] = True
        if (stream, entry_id) not in self._buffered and fields and not self._expired(entry_id):
            self._buffers[channel].append(msgpack.unpackb(fields[b"m"], raw=False))
        self._buffered.add((stream, entry_id))  # a pending entry read again is not delivered again
        async with client.pipeline(transaction=False) as pipe:
            pipe.xack(stream, RECEIVERS, entry_id)
            pipe.xdel(stream, entry_id)
            await pipe.execute()
        self._buffered.discard((stream, entry_id))
        self._recheck[stream] = pending  # more may be pending; a new entry needs no check

    async def _claim_abandoned(self, client: Redis, stream: str) -> bool:
        """Take over entries another consumer read and never acknowledged for CLAIM_IDLE_MS (its
        process died, or its connection was cut for good); True when some were."""
        try:
            reply: Any = await client.xautoclaim(
                stream, RECEIVERS, self._consumer, CLAIM_IDLE_MS, count=10, justid=True
            )
        except ResponseError:
            return False  # no group or no stream any more: the next read makes it
        return bool(reply)  # the ids claimed (redis-py answers only those with justid)

    async def _create_group(self, client: Redis, stream: str) -> None:
        try:
            # from the start: what was sent before any receiver came is theirs too
            await client.xgroup_create(stream, RECEIVERS, id="0", mkstream=True)
        except ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise
        await client.pexpire(stream, self._ttl_ms(), nx=True)

    def _expired(self, entry_id: bytes | str) -> bool:
        """An entry older than `expiry` (its id is Redis's clock when it was added; the clocks
        of Redis and this host are taken to agree within a second)."""
        text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        added_ms = int(text.partition("-")[0])
        cutoff_ms: float = (time.time() - self.expiry) * 1000 - 1000
        return added_ms < cutoff_ms

    async def _read_own_stream(self, stream: str, channel: str) -> None:
        """Read what came for this instance's process-specific channels, sort it into their
        buffers, then delete it from the stream (a read cut short is read again). Deleted a
        few reads at a time (DELETE_EVERY entries, or 1 % of the channel's capacity if that is
        less, so that what was read takes next to nothing of it): a read that also deletes is a
        pipeline, which costs redis-py more than the read alone."""
        connection = await self._own_connection()
        read_ids = self._read_ids
        read = ("XREAD", "COUNT", 100, "BLOCK", BLOCK_MS, "STREAMS", stream, self._last_id)
        try:
            if len(read_ids) >= max(1, min(DELETE_EVERY, self._capacity(channel) // 100)):
                # What the last reads took goes in the same round trip as the next read.
                await connection.send_packed_command(connection.pack_commands([("XDEL", stream, *read_ids), read]))
                await connection.read_response()
                self._read_ids = []
            else:
                await connection.send_command(*read)
            reply = await connection.read_response()
        except BaseException:
            # A read cut short (a failure, a cancel) leaves its reply unread: read again anew.
            await connection.disconnect(nowait=True)
            raise
        entries = _own_entries(reply)
        if not entries:
            return
        for entry_id, fields in entries:
            if self._expired(entry_id):
                continue
            # Written as m, c (the script's XADD); a pair's order is kept.
            message, target = fields[1], fields[3].decode()
            buffer = self._buffers[target]
            if len(buffer) >= self._capacity(target):
                buffer.popleft()
                logger.warning("channel %s: its buffer was full, the oldest message was dropped", target)
            buffer.append(msgpack.unpackb(message, raw=False))
        last = entries[-1][0]
        self._last_id = last.decode() if isinstance(last, bytes) else last
        self._read_ids += [entry_id for entry_id, _ in entries]

    # -- groups --------------------------------------------------------------------------------

    def _group(self, group: str) -> str:
        return f"{self.key_prefix}g:{group}"

    async def group_add(self, group: str, channel: str) -> None:
        assert self.require_valid_group_name(group), "Group name not valid"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        client = self._client()
        key = self._group(group)
        async with client.pipeline(transaction=True) as pipe:
            pipe.zadd(key, {channel: time.time()})
            pipe.expire(key, self.group_expiry)
            await pipe.execute()

    async def group_discard(self, group: str, channel: str) -> None:
        assert self.require_valid_group_name(group), "Group name not valid"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        await self._client().zrem(self._group(group), channel)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """`message` to every channel of `group`; those at their capacity are skipped and
        counted in a WARNING line. Two round trips: the members (those past `group_expiry`
        leave), then one script adding to each member's stream."""
        assert self.require_valid_group_name(group), "Group name not valid"
        assert "__asgi_channel__" not in message
        client = self._client()
        key = self._group(group)
        async with client.pipeline(transaction=True) as pipe:
            pipe.zremrangebyscore(key, "-inf", time.time() - self.group_expiry)
            pipe.zrange(key, 0, -1)
            _, members = await pipe.execute()
        if not members:
            return
        channels = [member.decode() for member in members]
        full = await self._add(channels, message)
        if full:
            logger.warning(
                "%d of %d channels over capacity in group %s: not sent to them", len(full), len(channels), group
            )

    # -- flush ---------------------------------------------------------------------------------

    async def flush(self) -> None:
        """Delete every key of this prefix, and what this instance buffered."""
        client = self._client()
        async for key in client.scan_iter(match=f"{self.key_prefix}*", count=1000):
            await client.delete(key)
        self._buffers.clear()
