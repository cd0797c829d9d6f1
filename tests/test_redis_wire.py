"""acp_channels._redis_wire: the inboxes' Redis client, its parser alone and against real Redis
(the machine's, or a private redis-server: tests.cluster.RedisServer)."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import BlockingConnectionPool
from redis.credentials import UsernamePasswordCredentialProvider

from acp_channels._redis_wire import ProtocolError, RedisReplyError, RedisWire, Script, _Connection, encode_command
from tests.cluster import RedisServer

# -- the parser, fed as Redis might split its replies ------------------------------------------

REPLIES = (
    b"+OK\r\n",
    b"-ERR wrong number of arguments\r\n",
    b":-42\r\n",
    b"$5\r\nh\r\nlo\r\n",  # CRLF inside a bulk string is data
    b"$0\r\n\r\n",
    b"$-1\r\n",
    b"*-1\r\n",
    b"*0\r\n",
    b"*2\r\n$3\r\nkey\r\n*3\r\n$1\r\na\r\n$-1\r\n:7\r\n",
    b"*2\r\n+OK\r\n-NOSCRIPT gone\r\n",
)


def expected_values() -> list[object]:
    return [
        "OK",
        ("error", "ERR wrong number of arguments"),
        -42,
        b"h\r\nlo",
        b"",
        None,
        None,
        [],
        [b"key", [b"a", None, 7]],
        ["OK", ("error", "NOSCRIPT gone")],
    ]


def comparable(value: object) -> object:
    if isinstance(value, RedisReplyError):
        return ("error", str(value))
    if isinstance(value, list):
        return [comparable(item) for item in value]
    return value


async def feed(pieces: list[bytes], replies: int) -> list[object]:
    connection = _Connection()
    futures = [await_free_future(connection) for _ in range(replies)]
    for piece in pieces:
        connection.data_received(piece)
    return [comparable(future.result()) for future in futures]


def await_free_future(connection: _Connection) -> asyncio.Future[object]:
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    connection.waiting.append((future, float("inf")))
    return future


async def test_every_reply_type_read_at_once() -> None:
    assert await feed([b"".join(REPLIES)], len(REPLIES)) == expected_values()


async def test_every_reply_type_read_a_byte_at_a_time() -> None:
    data = b"".join(REPLIES)
    assert await feed([data[i : i + 1] for i in range(len(data))], len(REPLIES)) == expected_values()


async def test_a_large_reply_in_pieces_is_read_whole() -> None:
    items = [bytes([65 + i % 26]) * (200_000 + i) for i in range(8)]
    data = b"*2\r\n$3\r\nkey\r\n*%d\r\n" % len(items) + b"".join(b"$%d\r\n%s\r\n" % (len(i), i) for i in items)
    pieces = [data[offset : offset + 65536] for offset in range(0, len(data), 65536)]
    assert await feed(pieces, 1) == [[b"key", items]]


async def test_a_reply_whose_caller_was_cancelled_is_dropped_and_the_next_goes_to_its_own() -> None:
    connection = _Connection()
    first, second = await_free_future(connection), await_free_future(connection)
    first.cancel()
    connection.data_received(b":1\r\n:2\r\n")
    assert second.result() == 2


async def test_bytes_that_are_not_resp_fail_every_waiting_command() -> None:
    connection = _Connection()
    waiting = await_free_future(connection)

    class Transport:
        aborted = False

        def abort(self) -> None:
            self.aborted = True

    connection.transport = Transport()  # type: ignore[assignment]
    connection.data_received(b"?what\r\n")
    with pytest.raises(ConnectionError):
        waiting.result()
    assert isinstance(connection.lost, ProtocolError)
    assert connection.transport.aborted  # type: ignore[attr-defined]


def test_commands_are_encoded_as_resp_arrays_of_bulk_strings() -> None:
    assert encode_command(("SET", b"k\r\n", 3, 0.5)) == b"*4\r\n$3\r\nSET\r\n$3\r\nk\r\n\r\n$1\r\n3\r\n$3\r\n0.5\r\n"


# -- against Redis -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    server = RedisServer.shared_or_private()
    yield server
    server.stop()


@pytest.fixture
async def client(redis: RedisServer) -> AsyncIterator[RedisWire]:
    wire = RedisWire(port=redis.port, reply_timeout=5.0)
    yield wire
    await wire.close()


def key() -> str:
    return f"acp-test-wire:{uuid.uuid4().hex}"


async def test_commands_from_many_tasks_are_answered_in_the_order_they_were_sent(client: RedisWire) -> None:
    name = key()
    lengths = await asyncio.gather(*(client.execute("RPUSH", name, str(i)) for i in range(500)))
    assert lengths == list(range(1, 501))
    assert await client.execute("LRANGE", name, 0, -1) == [str(i).encode() for i in range(500)]
    await client.execute("DEL", name)


async def test_a_caller_cancelled_while_waiting_leaves_the_others_replies_in_place(client: RedisWire) -> None:
    name = key()
    assert await client.execute("PING") == "PONG"  # connected: both commands below are written at once
    # A blocking pop that will be answered late, then a command queued behind it on the socket.
    popping = asyncio.ensure_future(client.execute("BLPOP", name, 2))
    pinging = asyncio.ensure_future(client.execute("PING"))
    await asyncio.sleep(0)  # both written
    popping.cancel()
    other = RedisWire(port=client.port)
    await other.execute("RPUSH", name, "x")
    await other.close()
    assert await pinging == "PONG"  # not the pop's reply
    assert await client.execute("ECHO", "after") == b"after"


async def test_a_caller_cancelled_while_connecting_does_not_fail_the_others(client: RedisWire) -> None:
    first = asyncio.ensure_future(client.execute("ECHO", "first"))
    second = asyncio.ensure_future(client.execute("ECHO", "second"))
    await asyncio.sleep(0)  # both wait for the connection
    first.cancel()
    assert await second == b"second"
    assert first.cancelled()


async def test_an_error_reply_raises_and_the_connection_goes_on(client: RedisWire) -> None:
    with pytest.raises(RedisReplyError) as raised:
        await client.execute("NOSUCHCOMMAND")
    assert raised.value.code == "ERR"
    assert await client.execute("PING") == "PONG"


async def test_a_script_redis_forgot_is_loaded_again(client: RedisWire) -> None:
    script = Script("return tonumber(ARGV[1]) + 1")
    assert await script(client, [], [41]) == 42
    await client.execute("SCRIPT", "FLUSH")
    assert await script(client, [], [1]) == 2


async def test_a_reply_later_than_its_timeout_drops_the_connection_and_the_next_command_connects(
    client: RedisWire,
) -> None:
    with pytest.raises(TimeoutError):
        await client.execute("BLPOP", key(), 5, timeout=0.2)
    assert await client.execute("PING") == "PONG"


async def test_a_connection_redis_closes_fails_what_waits_and_the_next_command_connects(client: RedisWire) -> None:
    my_id = await client.execute("CLIENT", "ID")
    waiting = asyncio.ensure_future(client.execute("BLPOP", key(), 5))
    await asyncio.sleep(0.05)
    killer = RedisWire(port=client.port)
    assert await killer.execute("CLIENT", "KILL", "ID", my_id) == 1
    await killer.close()
    with pytest.raises(ConnectionError):
        await waiting
    assert await client.execute("PING") == "PONG"
    assert await client.execute("CLIENT", "ID") != my_id


async def test_a_server_that_does_not_listen_is_a_connection_error() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    with pytest.raises(OSError):
        await RedisWire(port=port, connect_timeout=2.0).execute("PING")


async def test_a_client_made_on_another_event_loop_connects_again_on_this_one(redis: RedisServer) -> None:
    wire = RedisWire(port=redis.port, reply_timeout=5.0)

    def on_a_new_loop() -> object:
        return asyncio.new_event_loop().run_until_complete(wire.execute("PING"))

    assert await asyncio.get_running_loop().run_in_executor(None, on_a_new_loop) == "PONG"
    assert await wire.execute("PING") == "PONG"
    await wire.close()


# -- settings read from the layer's host entry ----------------------------------------------


@pytest.fixture(scope="module")
def guarded_redis() -> Iterator[RedisServer]:
    server = RedisServer.private("--requirepass", "s3cret", "--databases", "4")
    yield server
    server.stop()


async def test_a_url_with_password_and_database_is_followed(guarded_redis: RedisServer) -> None:
    pool = BlockingConnectionPool.from_url(f"redis://:s3cret@127.0.0.1:{guarded_redis.port}/3", socket_timeout=5)
    wire = RedisWire.for_pool(pool)
    assert wire is not None
    name = key()
    await wire.execute("SET", name, "in three")
    reader = RedisWire(port=guarded_redis.port, password="s3cret", db=3)
    assert await reader.execute("GET", name) == b"in three"
    assert await RedisWire(port=guarded_redis.port, password="s3cret").execute("GET", name) is None  # db 0
    await wire.close()
    await reader.close()


async def test_a_wrong_password_is_a_connection_error_that_names_the_refusal(guarded_redis: RedisServer) -> None:
    pool = BlockingConnectionPool.from_url(f"redis://:wrong@127.0.0.1:{guarded_redis.port}/0")
    wire = RedisWire.for_pool(pool)
    assert wire is not None
    with pytest.raises(ConnectionError, match="refused"):
        await wire.execute("PING")


def test_a_credential_provider_is_left_to_redis_py() -> None:
    pool = BlockingConnectionPool(credential_provider=UsernamePasswordCredentialProvider("u", "p"))
    assert RedisWire.for_pool(pool) is None


def test_the_pools_timeouts_become_the_clients() -> None:
    pool = BlockingConnectionPool.from_url("redis://10.1.2.3:7000/2", socket_timeout=30, socket_connect_timeout=4)
    wire = RedisWire.for_pool(pool)
    assert wire is not None
    assert (wire.host, wire.port, wire.db, wire.reply_timeout, wire.connect_timeout) == ("10.1.2.3", 7000, 2, 30, 4)


async def test_a_command_stuck_behind_a_blocking_one_times_out_by_its_own_deadline(client: RedisWire) -> None:
    assert await client.execute("PING") == "PONG"
    blocking = asyncio.ensure_future(client.execute("BLPOP", key(), 3, timeout=10))
    await asyncio.sleep(0)  # written first
    with pytest.raises(TimeoutError):
        await client.execute("PING", timeout=0.2)
    with pytest.raises(ConnectionError):  # the connection was given up with it
        await blocking
    assert await client.execute("PING") == "PONG"


async def test_a_bus_whose_first_act_is_a_send_uses_the_inbox(
    redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inbox is made with the layer; a send before anything else touched the layer went
    through the layer's sorted sets, which no inbox reads."""
    from acp_channels import _worker as worker
    from acp_channels.layers import RedisChannelLayer

    prefix = f"acp-test-{uuid.uuid4().hex[:8]}:"
    layer = RedisChannelLayer(hosts=[redis.url], prefix=prefix)
    monkeypatch.setattr(worker, "get_channel_layer", lambda: layer)
    bus = worker.Bus()
    await bus.send(worker.inbox_channel("abcdef123456"), {"type": "acp.push", "lease": "x", "end": True})
    reader = RedisWire(port=redis.port)
    assert await reader.execute("LLEN", f"{prefix}acp.worker.abcdef123456.inbox") == 1
    await reader.execute("DEL", f"{prefix}acp.worker.abcdef123456.inbox")
    await reader.close()
