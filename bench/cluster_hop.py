"""The cost of the cross-worker hop, on its own: bench/cluster-hop.json and bench/HOP.md.

    .venv/bin/python -m bench.cluster_hop --label after                        # this tree
    git worktree add /tmp/hop-before <commit>
    .venv/bin/python -m bench.cluster_hop --label before --code /tmp/hop-before
    .venv/bin/python -m bench.cluster_hop --render                             # HOP.md only

Starts three daphne workers on a private Redis (bench.servers.Cluster, every server process on
CPU 0, this load generator on CPU 1) and runs the layouts of bench.run.cluster_layouts over
HTTP: *same* (initialize, SSE and POST all on worker A: the same-process path) and *cross*
(initialize on A, SSE through B, POST through C: every POST and every event crosses Redis).
Each layout: a warm-up stream of 20,000 messages, then 7 repetitions of stream, rtt (1,000 turns) and
permission (100 turns) on one connection, the two layouts taking turns at each scenario of each
repetition; medians of the 7. Then it counts the Redis commands per echo
turn in each layout (`INFO commandstats` around 500 turns, less the heartbeats' idle rate).

A run is stored under its label in bench/cluster-hop.json with the commit of the code it ran
(`--code` runs the servers from another checkout: their cwd and PYTHONPATH) and the date; HOP.md
shows every stored run in one table, with the ratios of cross to same.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "cluster-hop.json"
REPORT = HERE / "HOP.md"
SIZES = {"warmup": 20000, "stream": 20000, "rtt": 1000, "permission": 100, "reps": 7}
COUNTED_TURNS = 500


def commit_of(tree: Path) -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True, timeout=10).stdout.strip()

    dirty = git("status", "--porcelain", "acp_channels")
    return git("rev-parse", "--short", "HEAD") + (" (dirty)" if dirty else "")


def redis_commands(port: int) -> dict[str, int]:
    """Calls per Redis command so far (INFO commandstats)."""
    import redis

    stats = redis.Redis(port=port).info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def command_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before.get(name, 0) for name in after if after[name] - before.get(name, 0)}


async def commands_per_turn(cluster: Any, factory: Any) -> dict[str, Any]:
    """Redis commands per echo turn in a layout, less what the workers' heartbeats issue meanwhile."""
    from bench import scenarios

    port = cluster.redis.redis_port
    client = factory()
    await client.open()
    await client.new_session()
    await scenarios.run_rtt(client, 50)  # warm
    idle_before, idle_started = redis_commands(port), time.perf_counter()
    await asyncio.sleep(2.0)  # the heartbeats' rate: a period, not a wait for an event
    idle = command_delta(idle_before, redis_commands(port))
    idle_seconds = time.perf_counter() - idle_started
    before, started = redis_commands(port), time.perf_counter()
    await scenarios.run_rtt(client, COUNTED_TURNS)
    seconds = time.perf_counter() - started
    used = command_delta(before, redis_commands(port))
    await client.close()
    scale = seconds / idle_seconds
    per_turn = {
        name: round((count - idle.get(name, 0) * scale) / COUNTED_TURNS, 2)
        for name, count in used.items()
        if name not in ("info",)
    }
    per_turn = {name: value for name, value in per_turn.items() if value >= 0.05}
    return {"per_turn": per_turn, "total": round(sum(per_turn.values()), 1)}


async def interleaved_layouts(factories: dict[str, Any]) -> dict[str, Any]:
    """Each layout's stream, rtt and permission, the layouts taking turns (bench.run's
    `scenario_rounds`): a machine whose speed drifts during a run shifts both alike, where one
    layout after the other showed drift as a difference between them."""
    from bench.run import Run, scenario_rounds

    runs = [Run(name, "http", factory) for name, factory in factories.items()]
    await scenario_rounds(runs, SIZES)
    return {run.key: run.summary() for run in runs}


async def run(label: str, code: Path) -> dict[str, Any]:
    from bench.client import HttpAcp
    from bench.run import log
    from bench.servers import CODE_ROOT, Cluster

    assert code == CODE_ROOT, (code, CODE_ROOT)
    load_before = os.getloadavg()[0]
    cluster = Cluster()
    cluster.start()
    try:
        a, b, c = (cluster.worker_url(i) for i in range(3))
        factories = {"same": lambda: HttpAcp(a), "cross": lambda: HttpAcp(a, post_url=c, stream_url=b)}
        layouts = await interleaved_layouts(factories)
        for name, factory in factories.items():
            if "error" not in layouts.get(name, {"error": ""}):
                try:
                    layouts[name]["redis"] = await commands_per_turn(cluster, factory)
                except Exception as error:
                    layouts[name]["redis"] = {"error": f"{type(error).__name__}: {error}"}
                    log(f"  {name}: counting FAILED: {error}")
                    for worker in cluster.workers:
                        log(f"  {worker.name} log tail:\n" + "".join(worker.log[-20:]))
                    continue
                log(f"  {name}: {layouts[name]['redis']['total']} Redis commands per echo turn")
    finally:
        cluster.stop()
        errors = cluster.errors()[:5]
    return {
        "label": label,
        "commit": commit_of(code),
        "code": str(code),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "sizes": SIZES,
        "layouts": layouts,
        #: 1-minute load average at the start and the end (2 cores: above 2, other work competed).
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "server_errors": errors,
    }


def render(stored: dict[str, Any]) -> str:
    lines = [
        "# The cross-worker hop",
        "",
        "Written by `python -m bench.cluster_hop` from `cluster-hop.json` (see bench/README.md). Three daphne "
        "workers on a private Redis, all on CPU 0; the load generator on CPU 1. *same*: initialize, SSE and "
        "POST on worker A (the same-process path). *cross*: initialize on A, both SSE streams through B, POSTs "
        "through C, so every POST and every event crosses Redis. HTTP; medians of the repetitions (3 "
        "before session 21, 7 since, the layouts taking turns) after a warm-up of 20,000 messages. "
        "Redis commands: per echo turn, counted with `INFO commandstats` over "
        f"{COUNTED_TURNS} turns, less the heartbeats.",
        "",
        "| run (commit, date) | layout | stream msg/s | rtt p50 ms | rtt p99 ms | permission p50 ms "
        "| Redis commands / echo turn |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    summary = [
        "",
        "| run | cross − same rtt p50 (ms) | cross / same streaming | Redis commands / cross turn |",
        "|---|--:|--:|--:|",
    ]
    for label, entry in stored.items():
        load = entry.get("load_average")
        shown_load = f", load {load[0]:.1f}→{load[1]:.1f}" if load else ""
        name = f"{label} ({entry['commit']}, {entry['date']}{shown_load})"
        layouts = entry["layouts"]
        for layout in ("same", "cross"):
            done = layouts.get(layout, {})
            if not done or "error" in done:
                lines.append(f"| {name} | {layout} | {done.get('error', '—')} | | | | |")
                continue
            redis = done.get("redis", {}).get("total", "—")
            lines.append(
                f"| {name} | {layout} | {statistics.median(done['stream']):,.0f} | {done['rtt']['p50']:.2f} | "
                f"{done['rtt']['p99']:.2f} | {done['permission']['p50']:.2f} | {redis} |"
            )
        same, cross = layouts.get("same", {}), layouts.get("cross", {})
        if same and cross and "error" not in same and "error" not in cross:
            hop = cross["rtt"]["p50"] - same["rtt"]["p50"]
            ratio = statistics.median(cross["stream"]) / statistics.median(same["stream"])
            summary.append(f"| {label} | +{hop:.2f} | {ratio:.2f}× | {cross.get('redis', {}).get('total', '—')} |")
    lines += summary
    lines += ["", "Targets (issue 13): cross − same rtt p50 within 2 ms; cross streaming at least 0.9× same.", ""]
    notes = HERE / "HOP-NOTES.md"
    if notes.exists():
        lines += [notes.read_text().rstrip(), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="after", help="the run's name in cluster-hop.json (replaces one so named)")
    parser.add_argument("--code", default=str(HERE.parent), help="the checkout whose acp_channels the workers run")
    parser.add_argument("--render", action="store_true", help="only write HOP.md from cluster-hop.json")
    args = parser.parse_args()
    stored: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if not args.render:
        # Before bench.servers is imported: it reads where the servers' code is at import.
        os.environ["BENCH_CODE_ROOT"] = str(Path(args.code).resolve())
        from bench.run import LOADGEN_CPU

        os.sched_setaffinity(0, {LOADGEN_CPU})
        import uvloop

        stored[args.label] = uvloop.run(run(args.label, Path(args.code).resolve()))
        RESULTS.write_text(json.dumps(stored, indent=1) + "\n")
    REPORT.write_text(render(stored))
    print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()
