"""Whether another worker is alive, decided from its heartbeat, never from how fast it answers.

Each worker keeps a Redis key (`<prefix>acp.alive.<worker id>`) that a thread of its own
refreshes every BEAT_INTERVAL over one Redis connection, with a generous time to live
(ALIVE_TTL_MS), and whose value is that connection's Redis client id. Another worker takes it
for dead when the key is gone (it stopped beating for ALIVE_TTL_MS: a hung or cut-off worker)
or when Redis no longer has that connection: a worker killed outright (`kill -9`) loses its
connections with its process, so its calls answer 404 at once, without waiting for any TTL.

Under load a worker's event loop lags (three workers, Redis and a balancer on one core, a burst
of a thousand clients): a beat sent from that loop came late, a 1.5 s key lapsed, and a live
worker was taken for dead (404). So the beat runs in a thread with its own event loop and
connection, and its key outlives many late beats. It still stops when the worker's loop has
made no progress for LOOP_STALL_LIMIT seconds (a hung worker is dead), which a loaded loop never
reaches: the loop only has to run a timer callback now and then.

The reading side follows the same rule: a worker is dead only when Redis answers so. A check
that does not complete (the caller's own loop is slow, Redis is slow) says nothing about the
other worker and is not taken as death.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

logger = logging.getLogger("acp_channels.liveness")

T = TypeVar("T")

#: How often a late reply's worker is checked again.
HEARTBEAT_INTERVAL: Final = 0.25
#: The longest pause between two checks of a late reply's worker.
MAX_RECHECK: Final = 2.0
#: How often a worker refreshes its key.
BEAT_INTERVAL: Final = 0.5
#: A worker that did not refresh its key for this long is dead (60 beats: late beats are fine).
ALIVE_TTL_MS: Final = 30_000
#: A worker whose event loop ran nothing for this long is hung: its heartbeat stops.
LOOP_STALL_LIMIT: Final = 30.0
#: How long one liveness check may take before its answer counts as unknown (not as dead).
CHECK_TIMEOUT: Final = 2.0
#: Redis connections for the checks (they are few and short; more wait for one).
CHECK_POOL_SIZE: Final = 8


class WorkerGone(Exception):
    """Redis says the worker's heartbeat is gone: the worker is dead."""


class Heartbeat:
    """This worker's heartbeat (beaten from a thread) and the check of other workers' ones.
    Needs a channels-redis layer (its `hosts` and `prefix`); with another layer there is no
    heartbeat and `alive` is False: a late answer then means dead."""

    def __init__(self) -> None:
        self._redis: Any = None  # the checking side's client, on the worker's loop
        self._prefix = ""
        self._worker_id = ""
        self._loop_seen = time.monotonic()
        self._ticker: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        #: The last liveness check of each worker (loop time it started, its task).
        self._checks: dict[str, tuple[float, asyncio.Task[bool]]] = {}
        self._load: Callable[[], dict[str, Any]] | None = None
        self._load_seen: dict[str, Any] | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(
        self, layer: Any, worker_id: str, *, beat: bool = True, load: Callable[[], dict[str, Any]] | None = None
    ) -> None:
        """Connect to the layer's Redis to check other workers and, with `beat`, start beating
        for `worker_id` (idempotent); call from the worker's event loop. Without `beat` (a
        process that hosts no connection) no worker counts this process as one. With `load` (a
        runner), each beat also publishes what it returns (read on the worker's loop) for
        placement (`runner_loads`)."""
        self._load = load
        hosts = getattr(layer, "hosts", None)
        if not hosts:
            return
        self._prefix = str(getattr(layer, "prefix", "asgi"))
        self._worker_id = worker_id
        if self._redis is None:
            self._redis = _client(hosts[0])
        if not beat:
            return
        loop = asyncio.get_running_loop()
        if self._ticker is None or self._ticker.cancelled():
            self._tick(loop)
        if not self.running:
            self._stopping.clear()
            self._thread = threading.Thread(
                target=self._run, args=(hosts[0],), name="acp-worker-heartbeat", daemon=True
            )
            self._thread.start()

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        """Runs on the worker's loop: proves the loop still runs callbacks (and reads the load
        there, not from the beating thread)."""
        self._loop_seen = time.monotonic()
        if self._load is not None:
            self._load_seen = self._load()
        self._ticker = loop.call_later(HEARTBEAT_INTERVAL, self._tick, loop)

    def key(self, worker_id: str) -> str:
        return f"{self._prefix}acp.alive.{worker_id}"

    def load_key(self, worker_id: str) -> str:
        return f"{self._prefix}acp.runner.{worker_id}"

    def _run(self, host: dict[str, Any]) -> None:
        asyncio.run(self._beat(host))

    async def _beat(self, host: dict[str, Any]) -> None:
        # One connection: the key names it, and it closes with the process.
        redis = _client(host, single_connection=True)
        key = self.key(self._worker_id)
        warned = False
        try:
            while not self._stopping.is_set():
                if time.monotonic() - self._loop_seen < LOOP_STALL_LIMIT:
                    try:
                        async with asyncio.timeout(ALIVE_TTL_MS / 1000):
                            # The id again each time: a reconnect gets a new one.
                            client_id = await redis.client_id()
                            await redis.set(key, client_id, px=ALIVE_TTL_MS)
                            if (load := self._load_seen) is not None:
                                text = json.dumps({**load, "client": client_id})
                                await redis.set(self.load_key(self._worker_id), text, px=ALIVE_TTL_MS)
                        warned = False
                    except Exception as error:  # Redis down: the calls themselves report it
                        if not warned:
                            logger.warning("heartbeat: could not reach Redis (%s)", error or type(error).__name__)
                            warned = True
                await asyncio.sleep(BEAT_INTERVAL)  # a period, not a wait for an event
            with contextlib.suppress(Exception):
                await redis.delete(key, self.load_key(self._worker_id))  # a clean stop: others know at once
        finally:
            with contextlib.suppress(Exception):
                await redis.aclose(close_connection_pool=True)

    def stop(self) -> None:
        """Stop beating (the key is deleted); for a worker that exits, and tests."""
        self._stopping.set()
        if self._ticker is not None:
            self._ticker.cancel()
        if self._thread is not None:
            self._thread.join(CHECK_TIMEOUT + BEAT_INTERVAL)
            self._thread = None

    async def live_workers(self) -> list[str]:
        """The ids of the workers whose heartbeat is there and whose beating connection Redis
        still has (this one included, once it beat): a killed worker is not listed, although
        its key outlives it."""
        return sorted(await self._beating(self.key(""), lambda value: (int(value), None)))

    async def runner_loads(self) -> dict[str, dict[str, Any]]:
        """The load each live runner last published, by runner id (a runner killed outright is
        not listed: Redis no longer has its beating connection)."""

        def load(value: Any) -> tuple[int, dict[str, Any]]:
            parsed = json.loads(value)
            if not isinstance(parsed, dict) or not isinstance(parsed.get("client"), int):
                raise ValueError("not a runner's load")
            return parsed["client"], parsed

        return await self._beating(self.load_key(""), load)

    async def _beating(self, prefix: str, read: Callable[[Any], tuple[int, Any]]) -> dict[str, Any]:
        """The keys under `prefix` whose beating connection Redis still has, by the rest of their
        name: `read` turns a key's value into (its beating client id, what to return for it)."""
        if self._redis is None:
            return {}
        keys = [key async for key in self._redis.scan_iter(match=_starting_with(prefix), count=1000)]
        if not keys:
            return {}
        found: dict[str, tuple[int, Any]] = {}
        for key, value in zip(keys, await self._redis.mget(keys), strict=True):
            name = key.decode() if isinstance(key, bytes) else str(key)
            with contextlib.suppress(TypeError, ValueError):  # gone since the scan, or not ours
                found[name.removeprefix(prefix)] = read(value)
        if not found:
            return {}
        clients = [client for client, _ in found.values()]
        connected = {int(entry["id"]) for entry in await self._redis.client_list(client_id=clients)}
        return {name: value for name, (client, value) in found.items() if client in connected}

    async def alive(self, worker_id: str) -> bool:
        """False when Redis answers that `worker_id` has no heartbeat (or there is no heartbeat
        at all); True when it has one, and when the check could not complete.

        Every caller waiting on the same worker shares one check per HEARTBEAT_INTERVAL: under a
        burst thousands of calls are late at once, and a check each would flood Redis."""
        if self._redis is None:
            return False
        loop = asyncio.get_running_loop()
        started, check = self._checks.get(worker_id, (0.0, None))
        if check is None or loop.time() - started > HEARTBEAT_INTERVAL:
            check = loop.create_task(self._check(worker_id))
            self._checks[worker_id] = (loop.time(), check)
        return await asyncio.shield(check)

    async def _check(self, worker_id: str) -> bool:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT):
                client_id = await self._redis.get(self.key(worker_id))
                if client_id is None:
                    return False  # it stopped beating long ago, or never beat
                # Its beating connection is gone with its process: dead now, whatever the TTL.
                return bool(await self._redis.client_list(client_id=[int(client_id)]))
        except Exception as error:
            logger.debug("heartbeat check of %s did not complete: %s", worker_id, error)
            return True


def _starting_with(prefix: str) -> str:
    """A SCAN pattern for the keys starting with `prefix` (its glob characters escaped)."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in prefix) + "*"


async def reply_or_gone(
    reply: asyncio.Future[T], worker_id: str, heartbeat: Heartbeat, *, expected: float, patience: float
) -> T:
    """`reply` (another worker's answer), expected within `expected` s. Past that it is waited
    for while the worker's heartbeat is there, up to `patience` s in all: WorkerGone as soon as
    the heartbeat is gone, TimeoutError past `patience` (a live worker too slow: 503, not 404).

    asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation that
    arrives as the reply does, and a cancelled SSE body would then run forever.
    """
    if reply.done():  # a result counts as its receipt: the second wait of a call is often this
        return reply.result()
    loop = asyncio.get_running_loop()
    give_up = loop.time() + max(patience, expected)
    wait = expected
    while True:
        try:
            async with asyncio.timeout(max(0.0, min(wait, give_up - loop.time()))):
                return await asyncio.shield(reply)
        except TimeoutError:
            if loop.time() >= give_up:
                raise
        if not await heartbeat.alive(worker_id):
            raise WorkerGone(worker_id)
        # Checked at once when the reply is late, then less and less often: thousands of late
        # calls must not keep the loop busy waking up.
        wait = min(MAX_RECHECK, HEARTBEAT_INTERVAL if wait == expected else wait * 2)


def _client(host: dict[str, Any], *, single_connection: bool = False) -> Any:
    """A Redis client with a small pool of its own for the layer's host entry: heartbeats and
    checks must not queue behind (or starve) the layer's traffic."""
    from redis.asyncio import Redis

    from acp_channels._streams_layer import connection_pool

    pool = connection_pool({**host, "max_connections": CHECK_POOL_SIZE}, CHECK_POOL_SIZE, CHECK_TIMEOUT)
    return Redis(connection_pool=pool, single_connection_client=single_connection)
