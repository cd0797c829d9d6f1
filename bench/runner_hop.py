"""Agents on a runner against the single process: bench/runners.json and bench/RUNNERS.md.

    .venv/bin/python -m bench.runner_hop --label "session 33"
    .venv/bin/python -m bench.runner_hop --memory-only --label "session 34"   # only the memory figures
    .venv/bin/python -m bench.runner_hop --render            # RUNNERS.md only

Two servers side by side, every server process on CPU 0 and this load generator on CPU 1:
*single*, one daphne process hosting its agents (the in-memory layer: the in-process limit of
the decided design), and *runner*, a web worker with AGENT_HOSTS "runners" and one `manage.py
acp_runner` on a private Redis (docs/runners.md): every request and every event crosses Redis
between the two. Over HTTP and WebSocket: a warm-up stream, then 3 repetitions of stream
(20,000 messages), rtt (1,000 echo turns) and permission (100 turns), the four layouts taking
turns at each scenario of each repetition; medians of the 3. Then the Redis commands per echo
turn through the runner (`INFO commandstats`, less the heartbeats), and where an echo turn's
time goes: each server process's CPU per turn (`cpu_per_turn`).

Then the memory of idle connections (`idle_memory`), on a web worker and a runner started for
it (fresh, so that the heap the scenarios freed does not absorb what is measured): 20
connections that come and go (imports, first allocations), then IDLE_CONNECTIONS connections
opened over HTTP and held open, in two steps: *initialized* (each an initialize POST, on a few
keep-alive connections; the runner opens each connection with its agent, the web worker keeps
nothing but what it places), then *with stream* (each connection's SSE stream opened and held:
the web worker holds the reader, the runner the stream). Each process's resident memory
(/proc VmRSS) is read once the step's last reply (initialize answered, stream head received)
has come and the memory has settled: sampled every 0.3 s until two readings agree within 64 KiB
(bench/memory.py `settled_rss`, at most 10 s). Growth over the settled memory before the step:
the web worker's in MB per 1,000 connections, the runner's in KB per connection; then DELETE
all, and the memory once settled again (what the allocator kept). `--memory-only` runs only
this part and stores it under `--label` next to what that label already has.

The targets (issue 26): through web worker + runner, streaming at least 0.8 x the single
process and rtt p50 at most +1.0 ms, on both transports.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "runners.json"
REPORT = HERE / "RUNNERS.md"
SIZES = {"warmup": 20000, "stream": 20000, "rtt": 1000, "permission": 100, "reps": 3}
IDLE_CONNECTIONS = 1000
#: Connections that come and go before the memory is read the first time.
WARM_CONNECTIONS = 20
#: Requests in flight at once while the idle connections are opened (initialize POSTs, stream GETs).
OPENERS = 8
#: The runner topology: a runner may hold every idle connection (the default cap is 1,000).
RUNNER_ENV = {"ACP_AGENT_HOSTS": "runners", "ACP_MAX_CONNECTIONS": "2000"}


def runner_topology(redis: Any) -> tuple[Any, Any]:
    """A web worker with AGENT_HOSTS "runners" and one runner on `redis` (started)."""
    from bench.servers import daphne, runner

    env = {
        "REDIS_URL": f"redis://127.0.0.1:{redis.redis_port}/0",
        "ACP_REDIS_PREFIX": f"acp-bench-{uuid.uuid4().hex[:8]}:",
        **RUNNER_ENV,
    }
    placed_on = runner("runner", env).start()
    try:
        web = daphne("web", "demo_project.asgi:application", env).start()
    except BaseException:
        placed_on.stop()
        raise
    return web, placed_on


def start_servers() -> tuple[Any, Any, Any]:
    """The single process, and the runner topology (web worker, runner, Redis)."""
    from bench.servers import OursDaphne, Redis

    single = OursDaphne().start()
    redis = Redis()
    redis.start()
    return single, runner_topology(redis), redis


class IdleConnections:
    """Opens, holds and ends idle HTTP connections on one web worker (`idle_memory`)."""

    def __init__(self, url: str) -> None:
        from bench.wire import HttpConnection

        self.url = url
        self.posts = [HttpConnection(url) for _ in range(OPENERS)]
        self.ids: list[str] = []
        self.streams: list[Any] = []

    async def _each(self, count: int, step: Any) -> None:
        """`step(post, index)` for index in range(count), OPENERS at a time."""
        queue = iter(range(count))

        async def opener(post: Any) -> None:
            for index in queue:
                await step(post, index)

        await asyncio.gather(*(opener(post) for post in self.posts))

    async def initialize(self, count: int) -> None:
        from bench.client import INIT_PARAMS, JSON, ProtocolError, orjson

        body = orjson.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT_PARAMS})

        async def one(post: Any, index: int) -> None:
            response = await post.request("POST", JSON, body)
            if response.status != 200 or "acp-connection-id" not in response.headers:
                raise ProtocolError(f"initialize: {response.status} {response.body[:200]!r}")
            self.ids.append(response.headers["acp-connection-id"])

        await self._each(count, one)

    async def open_streams(self) -> None:
        from bench.client import SSE, ProtocolError
        from bench.wire import SseStream

        async def one(post: Any, index: int) -> None:
            headers = {**SSE, "Acp-Connection-Id": self.ids[index]}
            stream = await SseStream.open(self.url, headers, lambda data: None)
            self.streams.append(stream)
            head = await asyncio.wait_for(stream.head, 30)
            if head.status != 200:
                raise ProtocolError(f"GET stream: {head.status}")

        await self._each(len(self.ids), one)

    async def delete(self) -> None:
        from bench.client import ProtocolError

        async def one(post: Any, index: int) -> None:
            response = await post.request("DELETE", {"Acp-Connection-Id": self.ids[index]})
            if not 200 <= response.status < 300:
                raise ProtocolError(f"DELETE: {response.status}")

        await self._each(len(self.ids), one)
        for stream in self.streams:
            stream.close()
        self.ids, self.streams = [], []

    def close(self) -> None:
        for stream in self.streams:
            stream.close()
        for post in self.posts:
            post.close()


async def idle_memory() -> dict[str, Any]:
    """The memory of IDLE_CONNECTIONS idle connections on a fresh web worker and runner (the
    module docstring says how)."""
    from bench.cluster_hop import commit_of
    from bench.memory import settled_rss
    from bench.run import log
    from bench.servers import Redis

    load_before = os.getloadavg()[0]
    redis = Redis()
    redis.start()
    try:
        web, placed_on = runner_topology(redis)
    except BaseException:
        redis.stop()
        raise
    pids = {"web worker": web.pid, "runner": placed_on.pid}
    connections = IdleConnections(f"http://127.0.0.1:{web.port}/acp")

    async def settled() -> dict[str, int]:
        return {name: await settled_rss([pid]) for name, pid in pids.items()}

    try:
        for _ in range(WARM_CONNECTIONS):
            await connections.initialize(1)
            await connections.open_streams()
            await connections.delete()
        rss = {"before": await settled()}
        began = time.monotonic()
        await connections.initialize(IDLE_CONNECTIONS)
        opened_seconds = time.monotonic() - began
        rss["initialized"] = await settled()
        began = time.monotonic()
        await connections.open_streams()
        streams_seconds = time.monotonic() - began
        rss["with stream"] = await settled()
        await connections.delete()
        rss["after delete"] = await settled()
    finally:
        connections.close()
        web.stop()
        placed_on.stop()
        redis.stop()
    per_connection = {
        name: {
            step: (rss[step][name] - rss["before"][name]) / IDLE_CONNECTIONS for step in ("initialized", "with stream")
        }
        for name in pids
    }
    memory = {
        "commit": commit_of(HERE.parent),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "connections": IDLE_CONNECTIONS,
        "seconds": {"initialize": round(opened_seconds, 1), "streams": round(streams_seconds, 1)},
        "rss_mb": {step: {name: round(value / 2**20, 1) for name, value in by.items()} for step, by in rss.items()},
        "web_mb_per_1000": {step: round(v * 1000 / 2**20, 2) for step, v in per_connection["web worker"].items()},
        "runner_kb_per_connection": {step: round(v / 1024, 1) for step, v in per_connection["runner"].items()},
        "server_errors": [line for proc in (web, placed_on) for line in proc.errors()][:5],
    }
    log(
        f"  {IDLE_CONNECTIONS} idle connections: web worker {memory['web_mb_per_1000']} MB per 1,000, "
        f"runner {memory['runner_kb_per_connection']} KB each"
    )
    return memory


#: Echo turns over which each process's CPU time is read (`cpu_per_turn`).
CPU_TURNS = 2000


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def cpu_per_turn(factory: Any, processes: dict[str, int]) -> dict[str, float]:
    """Where an echo turn's time goes: each server process's CPU ms per turn over CPU_TURNS
    sequential turns (every server shares CPU 0, so a turn's latency is about their sum)."""
    from bench import scenarios

    client = factory()
    await client.open()
    await client.new_session()
    await scenarios.run_rtt(client, 100)  # warm
    before = {name: cpu_seconds(pid) for name, pid in processes.items()}
    await scenarios.run_rtt(client, CPU_TURNS)
    after = {name: cpu_seconds(pid) for name, pid in processes.items()}
    await client.close()
    used = {name: round((after[name] - before[name]) * 1000 / CPU_TURNS, 3) for name in processes}
    return {name: ms for name, ms in used.items() if ms >= 0.01}


async def run(label: str) -> dict[str, Any]:
    from bench.client import HttpAcp, WsAcp
    from bench.cluster_hop import commands_per_turn, commit_of
    from bench.run import Run, scenario_rounds

    load_before = os.getloadavg()[0]
    single, (web, placed_on), redis = start_servers()
    web_url = f"http://127.0.0.1:{web.port}/acp"
    try:
        runs = [
            Run("single-http", "http", lambda: HttpAcp(single.url)),
            Run("runner-http", "http", lambda: HttpAcp(web_url)),
            Run("single-ws", "ws", lambda: WsAcp(single.url)),
            Run("runner-ws", "ws", lambda: WsAcp(web_url)),
        ]
        await scenario_rounds(runs, SIZES)
        layouts = {run.key: run.summary() for run in runs}

        class Topology:  # what commands_per_turn reads
            pass

        topology = Topology()
        topology.redis = redis  # type: ignore[attr-defined]
        layouts["runner-http"]["redis"] = await commands_per_turn(topology, lambda: HttpAcp(web_url))
        processes = {"single": single.pids()[0], "web": web.pid, "runner": placed_on.pid, "redis": redis.pid}
        for key, factory in (
            ("single-http", lambda: HttpAcp(single.url)),
            ("runner-http", lambda: HttpAcp(web_url)),
            ("single-ws", lambda: WsAcp(single.url)),
            ("runner-ws", lambda: WsAcp(web_url)),
        ):
            layouts[key]["cpu_ms_per_turn"] = await cpu_per_turn(factory, processes)
        errors = [line for proc in (web, placed_on, *single.procs) for line in proc.errors()]
    finally:
        for proc in (web, placed_on):
            proc.stop()
        single.stop()
        redis.stop()
    memory = await idle_memory()
    return {
        "label": label,
        "commit": commit_of(HERE.parent),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "sizes": SIZES,
        "layouts": layouts,
        "idle_memory": memory,
        "server_errors": errors,
    }


def _cpu(run: dict[str, Any], layout: str, process: str) -> str:
    value = run["layouts"][layout].get("cpu_ms_per_turn", {}).get(process)
    return "—" if value is None else f"{value:.2f}"


def _median(values: Any) -> float:
    return float(statistics.median(values)) if isinstance(values, list) else float(values)


def render(stored: dict[str, Any]) -> str:
    lines = [
        "# Agents on a runner against the single process",
        "",
        "Written by `python -m bench.runner_hop` from `runners.json` (see bench/README.md and the docstring of",
        "bench/runner_hop.py). *single*: one daphne process hosting its agents; *runner*: a web worker and a",
        'runner on a private Redis (AGENT_HOSTS "runners"). Medians of 3 repetitions, the layouts taking turns.',
        "",
        "| run (commit, date) | transport | single msg/s | runner msg/s | runner / single | single rtt p50 ms "
        "| runner rtt p50 ms | runner − single ms |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for run in stored.values():
        layouts = run.get("layouts", {})
        for transport in ("http", "ws"):
            single, runner = layouts.get(f"single-{transport}"), layouts.get(f"runner-{transport}")
            if not single or not runner or "error" in single or "error" in runner:
                continue
            s_stream, r_stream = _median(single["stream"]), _median(runner["stream"])
            s_rtt, r_rtt = single["rtt"]["p50"], runner["rtt"]["p50"]
            lines.append(
                f"| {run['label']} ({run['commit']}, {run['date']}) | {transport} | {s_stream:,.0f} | {r_stream:,.0f} "
                f"| {r_stream / s_stream:.2f}× | {s_rtt:.2f} | {r_rtt:.2f} | {r_rtt - s_rtt:+.2f} |"
            )
    cpu_rows = [
        f"| {run['label']} | {transport} | {_cpu(run, f'single-{transport}', 'single')} "
        f"| {_cpu(run, f'runner-{transport}', 'web')} | {_cpu(run, f'runner-{transport}', 'runner')} "
        f"| {_cpu(run, f'runner-{transport}', 'redis')} |"
        for run in stored.values()
        for transport in ("http", "ws")
        if "cpu_ms_per_turn" in run.get("layouts", {}).get(f"runner-{transport}", {})
    ]
    if cpu_rows:
        lines += [
            "",
            f"Where an echo turn's time goes: each server process's CPU ms per turn over {CPU_TURNS:,} turns",
            "(`cpu_per_turn`; they share CPU 0, so a turn's latency is about their sum).",
            "",
            "| run | transport | single process | runner layout: web worker | runner | Redis |",
            "|---|---|--:|--:|--:|--:|",
            *cpu_rows,
        ]
    lines += [
        "",
        f"Idle connections ({IDLE_CONNECTIONS:,} over HTTP on a fresh web worker and runner; *initialized*: each",
        "connection initialized, its agent on the runner; *+ stream*: each connection's SSE stream open too):",
        "resident memory grown over the settled memory before, once settled again. The last column: each",
        "process's MB before them and once all are DELETEd (what the allocator keeps for the next ones).",
        "",
        "| run (commit, date of the memory figures) | Redis commands / echo turn (runner, HTTP) "
        "| web worker MB / 1,000 connections: initialized | + stream | runner KB / connection: initialized "
        "| + stream | MB before → after DELETE: web worker, runner |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    earlier = []
    for run in stored.values():
        commands = run.get("layouts", {}).get("runner-http", {}).get("redis", {}).get("total", "—")
        memory = run.get("idle_memory")
        if memory is None:
            if "kb_per_idle_connection" in run:
                old = run["kb_per_idle_connection"]
                earlier.append(f"{run['label']}: web worker {old['web worker']} KB, runner {old['runner']} KB")
            lines.append(f"| {run['label']} ({run['commit']}, {run['date']}) | {commands} | — | — | — | — | — |")
            continue
        web, runner = memory["web_mb_per_1000"], memory["runner_kb_per_connection"]
        before, after = memory["rss_mb"]["before"], memory["rss_mb"]["after delete"]
        kept = ", ".join(f"{before[name]:.0f} → {after[name]:.0f}" for name in ("web worker", "runner"))
        lines.append(
            f"| {run['label']} ({memory['commit']}, {memory['date']}) | {commands} | {web['initialized']:.2f} "
            f"| {web['with stream']:.2f} | {runner['initialized']:.1f} | {runner['with stream']:.1f} | {kept} |"
        )
    if earlier:
        lines += [
            "",
            "Before session 34 the figure was 500 connections opened on the web worker and runner of the scenarios",
            "just after them and read at once, in KB per connection: "
            + "; ".join(earlier)
            + ". Noise: the heap the streams had freed took the new connections.",
        ]
    targets = "Targets (issue 26): runner / single streaming at least 0.8×; runner − single rtt p50 at most +1.0 ms."
    lines += ["", targets]

    return "\n".join([*lines, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="this tree", help="the run's name in runners.json (replaces one so named)")
    parser.add_argument("--render", action="store_true", help="only write RUNNERS.md from runners.json")
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="only the idle connections' memory, stored under --label (kept: the rest)",
    )
    args = parser.parse_args()
    stored: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if not args.render:
        from bench.run import LOADGEN_CPU

        os.sched_setaffinity(0, {LOADGEN_CPU})
        import uvloop

        if args.memory_only:
            entry = stored.setdefault(args.label, {"label": args.label})
            entry["idle_memory"] = uvloop.run(idle_memory())
            entry.pop("kb_per_idle_connection", None)  # the earlier method's figure, replaced
            entry.setdefault("commit", entry["idle_memory"]["commit"])
            entry.setdefault("date", entry["idle_memory"]["date"])
        else:
            stored[args.label] = uvloop.run(run(args.label))
        RESULTS.write_text(json.dumps(stored, indent=1) + "\n")
    REPORT.write_text(render(stored))
    print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()
