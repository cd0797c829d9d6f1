"""Agents on a runner against the single process: bench/runners.json and bench/RUNNERS.md.

    .venv/bin/python -m bench.runner_hop --label "session 33"
    .venv/bin/python -m bench.runner_hop --render            # RUNNERS.md only

Two servers side by side, every server process on CPU 0 and this load generator on CPU 1:
*single*, one daphne process hosting its agents (the in-memory layer: the in-process limit of
the decided design), and *runner*, a web worker with AGENT_HOSTS "runners" and one `manage.py
acp_runner` on a private Redis (docs/runners.md): every request and every event crosses Redis
between the two. Over HTTP and WebSocket: a warm-up stream, then 3 repetitions of stream
(20,000 messages), rtt (1,000 echo turns) and permission (100 turns), the four layouts taking
turns at each scenario of each repetition; medians of the 3. Then the Redis commands per echo
turn through the runner (`INFO commandstats`, less the heartbeats), and the resident memory of
the web worker and the runner with 500 idle connections open.

The targets (issue 26): through web worker + runner, streaming at least 0.8 x the single
process and rtt p50 at most +1.0 ms, on both transports.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "runners.json"
REPORT = HERE / "RUNNERS.md"
SIZES = {"warmup": 20000, "stream": 20000, "rtt": 1000, "permission": 100, "reps": 3}
IDLE_CONNECTIONS = 500
#: The runner's readiness line; its pid stands where a server's port would (bench.servers.Proc).
RUNNER_READY = re.compile(r"acp runner \w+ ready \(pid (\d+)\)")


def start_servers() -> tuple[Any, Any, Any]:
    """The single process, and the runner topology (web worker, runner, Redis)."""
    from bench.servers import OursDaphne, Proc, Redis, daphne

    single = OursDaphne().start()
    redis = Redis()
    redis.start()
    env = {
        "REDIS_URL": f"redis://127.0.0.1:{redis.redis_port}/0",
        "ACP_REDIS_PREFIX": f"acp-bench-{uuid.uuid4().hex[:8]}:",
        "ACP_AGENT_HOSTS": "runners",
    }
    runner = Proc("runner", [sys.executable, "manage.py", "acp_runner"], RUNNER_READY, env).start()
    web = daphne("web", "demo_project.asgi:application", env).start()
    return single, (web, runner), redis


async def idle_memory(url: str, pids: dict[str, int]) -> dict[str, float]:
    """Resident MB of each process before and after IDLE_CONNECTIONS idle HTTP connections."""
    import httpx

    from bench.servers import rss_bytes

    before = {name: rss_bytes([pid]) for name, pid in pids.items()}
    async with httpx.AsyncClient(timeout=60) as http:
        body = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
        ids = []
        for _ in range(IDLE_CONNECTIONS):
            response = await http.post(url, json=body, headers={"Accept": "application/json"})
            response.raise_for_status()
            ids.append(response.headers["acp-connection-id"])
        after = {name: rss_bytes([pid]) for name, pid in pids.items()}
        for connection_id in ids:
            await http.delete(url, headers={"Acp-Connection-Id": connection_id})
    return {name: round((after[name] - before[name]) / IDLE_CONNECTIONS / 1024, 1) for name in pids}


async def run(label: str) -> dict[str, Any]:
    from bench.client import HttpAcp, WsAcp
    from bench.cluster_hop import commands_per_turn, commit_of
    from bench.run import Run, log, scenario_rounds

    load_before = os.getloadavg()[0]
    single, (web, runner), redis = start_servers()
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
        memory = await idle_memory(web_url, {"web worker": web.pid, "runner": runner.pid})
        log(f"  KB per idle connection: {memory}")
        errors = [line for proc in (web, runner, *single.procs) for line in proc.errors()]
    finally:
        for proc in (web, runner):
            proc.stop()
        single.stop()
        redis.stop()
    return {
        "label": label,
        "commit": commit_of(HERE.parent),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "sizes": SIZES,
        "layouts": layouts,
        "kb_per_idle_connection": memory,
        "server_errors": errors,
    }


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
        layouts = run["layouts"]
        for transport in ("http", "ws"):
            single, runner = layouts[f"single-{transport}"], layouts[f"runner-{transport}"]
            if "error" in single or "error" in runner:
                continue
            s_stream, r_stream = _median(single["stream"]), _median(runner["stream"])
            s_rtt, r_rtt = single["rtt"]["p50"], runner["rtt"]["p50"]
            lines.append(
                f"| {run['label']} ({run['commit']}, {run['date']}) | {transport} | {s_stream:,.0f} | {r_stream:,.0f} "
                f"| {r_stream / s_stream:.2f}× | {s_rtt:.2f} | {r_rtt:.2f} | {r_rtt - s_rtt:+.2f} |"
            )
    lines += ["", "| run | Redis commands / echo turn (runner, HTTP) | KB per idle connection: web worker | runner |",
              "|---|--:|--:|--:|"]  # fmt: skip
    for run in stored.values():
        commands = run["layouts"]["runner-http"].get("redis", {}).get("total", "-")
        memory = run.get("kb_per_idle_connection", {})
        web, runner = memory.get("web worker", "-"), memory.get("runner", "-")
        lines.append(f"| {run['label']} | {commands} | {web} | {runner} |")
    targets = "Targets (issue 26): runner / single streaming at least 0.8×; runner − single rtt p50 at most +1.0 ms."
    lines += ["", targets]

    return "\n".join([*lines, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="this tree", help="the run's name in runners.json (replaces one so named)")
    parser.add_argument("--render", action="store_true", help="only write RUNNERS.md from runners.json")
    args = parser.parse_args()
    stored: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if not args.render:
        from bench.run import LOADGEN_CPU

        os.sched_setaffinity(0, {LOADGEN_CPU})
        import uvloop

        stored[args.label] = uvloop.run(run(args.label))
        RESULTS.write_text(json.dumps(stored, indent=1) + "\n")
    REPORT.write_text(render(stored))
    print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()
