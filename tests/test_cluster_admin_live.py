"""Seeing the cluster from outside: `manage.py acp_connections` and `acp_end_connection` run as
processes of their own against three live daphne workers on Redis, and each worker's
`/metrics` counts the calls it made to the others.

Connections are opened on chosen workers (direct URLs), over HTTP (an SSE connection stream
read on a third worker, a session stream, output nobody reads) and WebSocket, by a principal
that authenticated with a bearer token (the demo's ACP_TOKEN), each with its own stdio agent
process (tests/stdio_script_agent.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from tests import forked
from tests.agent_processes import supported
from tests.cluster import Cluster, RedisServer
from tests.live import JSON, ROOT, open_sse, rpc

pytestmark = pytest.mark.skipif(not supported(), reason="process checks read /proc (Linux)")

TOKEN = "cluster-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SCRIPT_AGENT = [sys.executable, str(ROOT / "tests" / "stdio_script_agent.py")]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # A Redis of its own: a shared one busy with other tests' bursts times out the workers'
    # heartbeats, and remote streams end before they can be listed.
    redis_server = RedisServer.private()
    env = {
        "ACP_AGENT": json.dumps({"command": SCRIPT_AGENT}),
        "ACP_AGENT_SHUTDOWN_GRACE": "0.3",
        "ACP_TOKEN": TOKEN,
        "ACP_KEEPALIVE_SECONDS": "0.5",
        # Measured before the streams were pushed: a remote reader's pull answered later than
        # WORKER_TIMEOUT_SECONDS past its wait ended its SSE stream as if the host's worker were
        # dead, and on a loaded machine (load average ~10 on 2 cores) that ended the streams this
        # test lists. This test is about seeing them, not about latency: the workers get time.
        "ACP_WORKER_TIMEOUT_SECONDS": "10",
    }
    cluster = Cluster(redis_server, env=env).start()
    yield cluster
    cluster.stop()
    redis_server.stop()


def manage(cluster: Cluster, *argv: str) -> subprocess.CompletedProcess[str]:
    """`manage.py <argv>` in a process of its own, with the workers' settings (their Redis and
    prefix), as an operator would run it on a worker's machine."""
    env = {
        **os.environ,
        **cluster.workers[0].env,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "demo_project.settings",
    }
    return forked.run(
        [sys.executable, "manage.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


async def listing(cluster: Cluster, *extra: str) -> dict[str, Any]:
    result = await asyncio.to_thread(manage, cluster, "acp_connections", "--json", *extra)
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


async def initialize(http: httpx.AsyncClient, url: str) -> str:
    body = rpc(0, "initialize", {"protocolVersion": 1})
    response = await http.post(url, headers={**JSON, **AUTH}, json=body)
    assert response.status_code == 200, response.text
    return response.headers["acp-connection-id"]


async def post(
    http: httpx.AsyncClient, url: str, body: Any, connection_id: str, session_id: str | None = None
) -> httpx.Response:
    headers = {**JSON, **AUTH, "Acp-Connection-Id": connection_id}
    if session_id is not None:
        headers["Acp-Session-Id"] = session_id
    return await http.post(url, headers=headers, content=json.dumps(body))


def worker_of(connection_id: str) -> str:
    return connection_id.rpartition(".")[2]


def parent_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


async def scrape(http: httpx.AsyncClient, url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A worker's /metrics as {(sample name, sorted labels): value}."""
    response = await http.get(url.removesuffix("acp") + "metrics")
    assert response.status_code == 200, response.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


async def test_connections_across_workers_listed_and_one_ended(cluster: Cluster, http: httpx.AsyncClient) -> None:
    a, b, c = cluster.workers
    # Connection 1, hosted by a: its connection stream read on c, a session stream read on b.
    first = await initialize(http, a.url)
    async with open_sse(http, c.url, first, **AUTH) as connection_stream:
        assert (
            await post(http, b.url, rpc(1, "session/new", {"cwd": "/", "mcpServers": []}), first)
        ).status_code == 202
        session_id = (await connection_stream.next())["result"]["sessionId"]
        async with open_sse(http, b.url, first, session_id, **AUTH) as session_stream:
            prompt = rpc(
                2, "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "echo hi"}]}
            )
            assert (await post(http, c.url, prompt, first, session_id)).status_code == 202
            assert (await session_stream.next())["params"]["update"]["content"]["text"] == "hi"
            assert (await session_stream.next())["result"] == {"stopReason": "end_turn"}

            # Connection 2, hosted by c: a reply nobody reads (buffered), no reader (idle).
            second = await initialize(http, c.url)
            assert (
                await post(http, c.url, rpc(1, "session/new", {"cwd": "/", "mcpServers": []}), second)
            ).status_code == 202

            # Connection 3, a WebSocket hosted by b.
            async with connect(b.ws_url, additional_headers=AUTH, proxy=None) as ws:
                third = ws.response.headers["Acp-Connection-Id"]
                await ws.send(json.dumps(rpc(0, "initialize", {"protocolVersion": 1})))
                assert json.loads(await ws.recv())["id"] == 0

                document = await listing(cluster)
                # Output of connection 2 waiting for its reader: what the listing says it holds.
                async with open_sse(http, a.url, second, **AUTH) as late_reader:
                    waiting = await late_reader.next()

            # Every live worker answered: a (hosting), b (hosting), c (hosting, reading remotely).
            assert sorted(document["workers"]) == sorted({worker_of(first), worker_of(second), worker_of(third)})
            assert document["silent_workers"] == []
            infos = {info["connection_id"]: info for info in document["connections"]}
            assert set(infos) == {first, second, third}
            ages = [info["age_seconds"] for info in document["connections"]]
            assert ages == sorted(ages, reverse=True)  # oldest first
            assert [info["connection_id"] for info in document["connections"]] == [first, second, third]
            processes = {a.process.pid: a, b.process.pid: b, c.process.pid: c}  # type: ignore[union-attr]
            for connection_id, info in infos.items():
                assert info["worker"] == worker_of(connection_id)
                assert info["principal"] == "token:team"
                assert info["age_seconds"] > 0
                assert 0 <= info["idle_seconds"] <= info["age_seconds"]
                # The agent is a process of the worker that hosts the connection.
                assert (
                    processes[parent_of(info["agent_pid"])].url
                    == {
                        first: a.url,
                        second: c.url,
                        third: b.url,
                    }[connection_id]
                )
            assert infos[first]["transport"] == "http" and infos[first]["sessions"] == 1
            assert infos[first]["idle_seconds"] == 0  # its streams have readers
            assert infos[second]["transport"] == "http" and infos[second]["sessions"] == 0
            assert infos[second]["idle_seconds"] > 0  # nobody reads it
            # The agent's line as it wrote it (json.dumps), relayed unchanged: what the host holds.
            assert infos[second]["buffered_bytes"] == len(json.dumps(waiting))
            assert infos[third]["transport"] == "websocket" and infos[third]["sessions"] == 0
            assert infos[third]["idle_seconds"] == 0

            # The readable table says the same.
            table = await asyncio.to_thread(manage, cluster, "acp_connections")
            assert table.returncode == 0, table.stderr
            lines = table.stdout.splitlines()
            assert lines[0].split() == ["CONNECTION", "WORKER", "PRINCIPAL", "TRANSPORT", "SESSIONS", "AGE", "IDLE",
                                        "BUFFERED", "AGENT", "PID"]  # fmt: skip
            row = next(line.split() for line in lines if line.startswith(first))
            assert row[1:5] == [worker_of(first), "token:team", "http", "1"]
            assert row[-1] == str(infos[first]["agent_pid"])

            # End connection 1 from outside: its streams on b and c end, its POSTs get 404.
            ended = await asyncio.to_thread(manage, cluster, "acp_end_connection", first)
            assert ended.returncode == 0, ended.stderr
            assert ended.stdout.strip() == f"ended {first}"
            await connection_stream.wait_ended()
            await session_stream.wait_ended()
            assert connection_stream.error is None and session_stream.error is None  # ended, not cut
    for worker in cluster.workers:
        assert (await post(http, worker.url, rpc(3, "test/raw"), first)).status_code == 404
    assert any(f"connection={first}" in line and "reason=delete" in line for line in cluster.log)

    # Ending it again, and ending ids nobody hosts: a clear message, a non-zero status.
    for unknown in (first, f"{uuid.uuid4()}.{worker_of(second)}", f"{uuid.uuid4()}.000000000000", "not-an-id"):
        result = await asyncio.to_thread(manage, cluster, "acp_end_connection", unknown)
        assert result.returncode == 1
        assert f"no live worker hosts a connection {unknown}" in result.stderr
    assert {info["connection_id"] for info in (await listing(cluster))["connections"]} == {second}
    ended = await asyncio.to_thread(manage, cluster, "acp_end_connection", second)
    assert ended.returncode == 0, ended.stderr
    assert (await listing(cluster))["connections"] == []
    assert not cluster.errors()


async def test_a_live_worker_that_does_not_answer_is_named(cluster: Cluster, http: httpx.AsyncClient) -> None:
    """A worker whose heartbeat is fresh but which never answers (here a heartbeat key, on a
    connection kept open, with no worker behind it): listed as silent, exit status 2, the
    others' connections still listed."""
    connection_id = await initialize(http, cluster.workers[0].url)
    silent = "deadbeef0000"
    prefix = cluster.workers[0].env["ACP_REDIS_PREFIX"]
    # A heartbeat names the Redis connection that beats (_liveness.py): this one stays open.
    key = f"{prefix}acp.alive.{silent}"
    beating = redis.Connection(host="127.0.0.1", port=cluster.redis.port)
    beating.send_command("CLIENT", "ID")
    beating.send_command("SET", key, beating.read_response(), "PX", 60_000)
    assert beating.read_response() in (b"OK", "OK")
    try:
        result = await asyncio.to_thread(manage, cluster, "acp_connections", "--json")
    finally:
        beating.send_command("DEL", key)
        beating.read_response()
        beating.disconnect()
    assert result.returncode == 2
    document = json.loads(result.stdout)
    assert document["silent_workers"] == [silent]
    assert silent in document["workers"]
    assert connection_id in {info["connection_id"] for info in document["connections"]}
    assert f"workers that did not answer (their connections are not listed): {silent}" in result.stderr
    assert (
        await http.delete(cluster.workers[0].url, headers={**AUTH, "Acp-Connection-Id": connection_id})
    ).status_code == 202


async def test_without_a_shared_layer_the_commands_say_they_reach_no_worker() -> None:
    """The in-memory layer (no REDIS_URL): the command's process is alone; it says so."""
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env |= {"PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "demo_project.settings"}
    for argv in (["acp_connections"], ["acp_end_connection", f"{uuid.uuid4()}.000000000000"]):
        result = await asyncio.to_thread(
            subprocess.run, [sys.executable, "manage.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert result.returncode == 1
        assert "the channel layer is in-memory: it reaches no other process" in result.stderr


async def test_cross_worker_calls_are_counted_by_the_caller(cluster: Cluster, http: httpx.AsyncClient) -> None:
    a, b, c = cluster.workers
    before = {worker.url: await scrape(http, worker.url) for worker in cluster.workers}
    connection_id = await initialize(http, a.url)
    # b forwards two POSTs to a; c leases a stream of a (which a pushes); b asks a for a connection
    # it does not host (refused: 404).
    async with open_sse(http, c.url, connection_id, **AUTH) as reader:
        for n in (1, 2):
            assert (await post(http, b.url, rpc(n, "test/raw"), connection_id)).status_code == 202
            assert (await reader.next())["id"] == n
        unknown = f"{uuid.uuid4()}.{worker_of(connection_id)}"
        assert (await post(http, b.url, rpc(3, "test/raw"), unknown)).status_code == 404
    after = {worker.url: await scrape(http, worker.url) for worker in cluster.workers}

    def grew(worker: Any, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[worker.url].get(key, 0.0) - before[worker.url].get(key, 0.0)

    assert grew(b, "acp_cross_worker_calls_total", op="submit", outcome="ok") == 2
    assert grew(b, "acp_cross_worker_calls_total", op="submit", outcome="refused") == 1
    assert grew(b, "acp_cross_worker_call_seconds_count", op="submit") == 3
    assert grew(b, "acp_cross_worker_call_seconds_sum", op="submit") > 0
    assert grew(c, "acp_cross_worker_calls_total", op="lease", outcome="ok") == 1
    # a hosts the connection: it served those calls and made none of them.
    assert grew(a, "acp_cross_worker_calls_total", op="submit", outcome="ok") == 0
    assert grew(a, "acp_messages_in_total", transport="http") == 3  # initialize and two POSTs
    # Each worker names itself: a worker id per scrape, the one in its connection ids.
    names = [
        [dict(labels)["worker"] for name, labels in after[worker.url] if name == "acp_worker_info"]
        for worker in cluster.workers
    ]
    assert all(len(name) == 1 for name in names) and len({name[0] for name in names}) == 3
    assert names[0] == [worker_of(connection_id)]
    assert (await http.delete(a.url, headers={**AUTH, "Acp-Connection-Id": connection_id})).status_code == 202
