"""A lean Redis client for the worker inboxes: RESP2 on one asyncio connection, pipelined.

A cross-worker turn is a handful of inbox commands (a script call per send, a blocking pop per
receive), and redis-py spends about 200 µs of CPU on each (a pool checkout, retry and encoder
layers, its parser): three times the round trip itself, on the same core as the workers
(bench/HOP.md). The inboxes need two commands on two connections; this is that, and no more:

- Commands are written at once and answered in the order they were written (Redis answers a
  connection's commands in order), so the sends of every task in a worker pipeline on one
  socket, keep their order, and a caller cancelled while waiting leaves the replies aligned.
- A broken connection fails every command in flight with ConnectionError; the next command
  connects again. A reply later than its timeout breaks the connection (what Redis did with the
  command is unknown), raising TimeoutError.
- Where to connect comes from redis-py's reading of the host entry (its connection pool's
  settings: URL, db, username and password, TLS); `for_pool` returns None for what it does not
  handle (a credential provider), and the inbox keeps redis-py there.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import ssl
from typing import Any, Final

__all__ = ["RedisReplyError", "RedisWire", "Script"]

Arg = bytes | str | int | float


class RedisReplyError(Exception):
    """Redis answered a command with an error (`-ERR ...`, `-NOSCRIPT ...`)."""

    @property
    def code(self) -> str:
        return str(self).partition(" ")[0]


class _Incomplete(Exception):  # control flow inside the parser, never raised out of it
    """The buffer ends inside a reply; `need` is the length it must reach to go on (or 0)."""

    def __init__(self, need: int = 0) -> None:
        self.need = need


class ProtocolError(ConnectionError):
    """The bytes from Redis are not RESP: the connection is dropped."""


_CRLF: Final = b"\r\n"


def _scan(buffer: bytearray, start: int, view: memoryview | None) -> tuple[Any, int]:
    """The reply at `start` and where the next begins. Without a view of the buffer only checks
    that the reply is complete (no copies): a large reply arriving in pieces is scanned, not
    copied, each time a piece comes."""
    end = buffer.find(_CRLF, start)
    if end < 0:
        raise _Incomplete()
    kind = buffer[start]
    after = end + 2
    if kind == 0x24:  # $ bulk string
        length = int(buffer[start + 1 : end])
        if length < 0:
            return None, after
        stop = after + length
        if len(buffer) < stop + 2:
            raise _Incomplete(stop + 2)
        return (None if view is None else bytes(view[after:stop])), stop + 2
    if kind == 0x2A:  # * array
        count = int(buffer[start + 1 : end])
        if count < 0:
            return None, after
        items: list[Any] = []
        position = after
        for _ in range(count):
            item, position = _scan(buffer, position, view)
            items.append(item)
        return items, position
    if kind == 0x3A:  # : integer
        return int(buffer[start + 1 : end]), after
    if kind == 0x2B:  # + simple string
        return buffer[start + 1 : end].decode(), after
    if kind == 0x2D:  # - error
        return RedisReplyError(buffer[start + 1 : end].decode(errors="replace")), after
    raise ProtocolError(f"not a RESP reply: {bytes(buffer[start : start + 40])!r}")


def encode_command(args: tuple[Arg, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        else:
            data = repr(arg).encode()  # ints and floats as Redis reads them
        parts += (b"$%d\r\n" % len(data), data, _CRLF)
    return b"".join(parts)


#: Below this many buffered bytes a reply is read in one pass; above, it is first checked to be
#: complete, so a large reply arriving in pieces is not copied again with each piece.
_ONE_PASS_BYTES: Final = 65536


class _Connection(asyncio.Protocol):
    """One socket to Redis: writes commands, hands each reply to the oldest waiting future.
    One timer watches every deadline of the commands in flight (not one timer per command)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        self.lost: BaseException | None = None
        self._buffer = bytearray()
        self._need = 0
        self._writable = asyncio.Event()
        self._writable.set()
        self._loop = asyncio.get_running_loop()
        self._watchdog: asyncio.TimerHandle | None = None
        self._watching = float("inf")  # the deadline the watchdog fires at

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        if len(buffer) < self._need:
            return
        position = 0
        try:
            while position < len(buffer):
                try:
                    if len(buffer) - position > _ONE_PASS_BYTES:
                        _scan(buffer, position, None)
                    with memoryview(buffer) as view:  # released before the buffer is resized
                        reply, end = _scan(buffer, position, view)
                except _Incomplete as incomplete:
                    self._need = incomplete.need - position
                    break
                position = end
                if not self.waiting:
                    raise ProtocolError("a reply to no command")
                future, _ = self.waiting.popleft()
                if not future.done():  # its caller may have been cancelled: the reply is dropped
                    future.set_result(reply)
            else:
                self._need = 0
        except (ProtocolError, ValueError) as error:
            self._fail(ProtocolError(str(error)))
            return
        finally:
            if position:
                del buffer[:position]

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("Redis closed the connection"))
        self._writable.set()

    def _fail(self, error: BaseException, late_before: float = float("-inf")) -> None:
        """Every command in flight fails (ConnectionError; TimeoutError for those whose deadline
        is before `late_before`) and the socket is dropped."""
        if self.lost is None:
            self.lost = error if isinstance(error, ConnectionError | OSError) else ConnectionError(str(error))
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        while self.waiting:
            future, deadline = self.waiting.popleft()
            if not future.done():
                if deadline < late_before:
                    future.set_exception(TimeoutError("a Redis reply timed out"))
                else:
                    future.set_exception(ConnectionError(f"Redis connection lost: {self.lost}"))
        if self.transport is not None:
            self.transport.abort()

    def send(self, data: bytes, timeout: float | None) -> asyncio.Future[Any]:
        """Write a command (the caller checked `writable`); its reply comes on the future."""
        if self.lost is not None or self.transport is None:
            raise ConnectionError(f"Redis connection lost: {self.lost}")
        future = self._loop.create_future()
        deadline = float("inf") if timeout is None else self._loop.time() + timeout
        self.waiting.append((future, deadline))
        self.transport.write(data)
        if deadline < self._watching:
            self._watch(deadline)
        return future

    @property
    def writable(self) -> bool:
        return self._writable.is_set()

    async def wait_writable(self) -> None:
        await self._writable.wait()  # the socket's buffer is full: wait, do not pile up

    def _watch(self, deadline: float) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watching = deadline
        self._watchdog = self._loop.call_at(deadline, self._check_deadlines)

    def _check_deadlines(self) -> None:
        self._watchdog, self._watching = None, float("inf")
        now = self._loop.time()
        pending = [deadline for future, deadline in self.waiting if not future.done()]
        if any(deadline <= now for deadline in pending):
            # What Redis did with the late command is unknown: the connection is given up.
            self._fail(TimeoutError("a Redis reply timed out"), late_before=now + 1e-9)
        elif pending and min(pending) < float("inf"):
            self._watch(min(pending))


class RedisWire:
    """A client on one connection to one Redis server; commands from any number of tasks."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 6379,
        path: str | None = None,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        connect_timeout: float | None = None,
        reply_timeout: float | None = None,
    ) -> None:
        self.host, self.port, self.path, self.db = host, port, path, db
        self._username, self._password = username, password
        self._ssl, self._server_hostname = ssl_context, server_hostname
        self.connect_timeout = connect_timeout if connect_timeout is not None else reply_timeout
        self.reply_timeout = reply_timeout
        self._connection: _Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Task[_Connection] | None = None

    @classmethod
    def for_pool(cls, pool: Any) -> RedisWire | None:
        """A client for the server a redis-py connection pool connects to, with its settings;
        None when it needs what this client does not do (a credential provider)."""
        kwargs: dict[str, Any] = dict(getattr(pool, "connection_kwargs", {}))
        if kwargs.get("credential_provider") is not None:
            return None
        connection_class = getattr(pool, "connection_class", None)
        context: ssl.SSLContext | None = None
        if connection_class is not None and "ssl" in connection_class.__name__.lower():
            try:
                # redis-py turns the ssl_* settings into a context; the same one is used here.
                context = connection_class(**kwargs).ssl_context.get()
            except Exception:
                return None
        host = str(kwargs.get("host", "localhost"))
        return cls(
            host=host,
            port=int(kwargs.get("port", 6379)),
            path=kwargs.get("path"),
            db=int(kwargs.get("db", 0) or 0),
            username=kwargs.get("username"),
            password=kwargs.get("password"),
            ssl_context=context,
            server_hostname=host if context is not None else None,
            connect_timeout=kwargs.get("socket_connect_timeout"),
            reply_timeout=kwargs.get("socket_timeout"),
        )

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        connection = self._connection
        if connection is not None and connection.lost is None and self._loop is loop:
            return connection
        if self._connecting is None or self._loop is not loop or self._connecting.done():
            if connection is not None and connection.transport is not None and self._loop is loop:
                connection.transport.abort()
            self._connection, self._loop = None, loop
            # A task of its own: a caller cancelled while it connects does not fail the others.
            self._connecting = loop.create_task(self._open(loop), name="acp-redis-connect")
        connecting = self._connecting
        try:
            connection = await asyncio.shield(connecting)
        except asyncio.CancelledError:
            if connecting.done() and not connecting.cancelled():
                connecting.exception()  # retrieved: its failure reaches the next caller
            raise
        if self._connecting is connecting:
            self._connection = connection
        return connection

    async def _open(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        async with asyncio.timeout(self.connect_timeout):
            if self.path:
                _, connection = await loop.create_unix_connection(_Connection, self.path)
            else:
                _, connection = await loop.create_connection(
                    _Connection, self.host, self.port, ssl=self._ssl, server_hostname=self._server_hostname
                )
            setup: list[tuple[Arg, ...]] = []
            if self._password is not None:
                setup.append(("AUTH", self._username, self._password) if self._username else ("AUTH", self._password))
            if self.db:
                setup.append(("SELECT", self.db))
            try:
                replies = [connection.send(encode_command(args), None) for args in setup]
                for reply in replies:
                    if isinstance(await reply, RedisReplyError):
                        raise ConnectionError(f"Redis refused the connection: {await reply}")
            except BaseException:
                connection._fail(ConnectionError("setup failed"))
                raise
        return connection

    async def execute(self, *args: Arg, timeout: float | None = None) -> Any:
        """The reply to one command; an error reply raises RedisReplyError. `timeout` (default:
        the pool's socket timeout) bounds the wait for the reply; past it the connection is
        dropped and TimeoutError raised."""
        connection = self._connection
        if connection is None or connection.lost is not None or self._loop is not asyncio.get_running_loop():
            connection = await self._connect()
        if not connection.writable:
            await connection.wait_writable()
        reply = await connection.send(encode_command(args), self.reply_timeout if timeout is None else timeout)
        if isinstance(reply, RedisReplyError):
            raise reply
        return reply

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and connection.transport is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nothing left to close
                connection.transport.close()


class Script:
    """A Lua script run by its SHA1 (EVALSHA), loaded again when Redis forgot it (NOSCRIPT)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()  # Redis names scripts by their SHA1

    async def __call__(self, client: RedisWire, keys: list[Arg], args: list[Arg]) -> Any:
        try:
            return await client.execute("EVALSHA", self.sha, len(keys), *keys, *args)
        except RedisReplyError as error:
            if error.code != "NOSCRIPT":
                raise
            return await client.execute("EVAL", self.source, len(keys), *keys, *args)
