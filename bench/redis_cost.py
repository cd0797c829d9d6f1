"""What one message between a web worker and a runner costs the processes: the client-side CPU of
one Redis command through redis-py's asyncio client, against the same command written and read
on a bare asyncio connection with hiredis (the floor of any client), and the CPU of the Streams
layer's send and receive (acp_channels/_streams_layer.py) per message. bench/redis-cost.json and
bench/REDIS-COST.md.

    .venv/bin/python -m bench.redis_cost --label "session 35"
    .venv/bin/python -m bench.redis_cost --render

On a private Redis (bench.servers.Redis) pinned to CPU 0, this process on CPU 1; each figure the
median of 3 runs of 3,000 calls, in microseconds of this process's CPU (user + system) per call.
Why: an echo turn through a runner is two such messages (docs/runners.md, "What it costs"),
and each costs both ends a command; the round-trip target of issue 26 is +1.0 ms over the
single process for everything a turn adds.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "redis-cost.json"
REPORT = HERE / "REDIS-COST.md"
CALLS = 3000
RUNS = 3
LOADGEN_CPU = 1

ROWS = {
    "raw": "EVALSHA on a bare asyncio connection, hiredis packing and parsing (the floor)",
    "ping": "PING through redis-py",
    "evalsha": "EVALSHA through redis-py (Redis.evalsha)",
    "script": "EVALSHA through redis-py's registered script (what the layer calls)",
    "layer_send": "the Streams layer's send to a process-specific channel",
    "layer_round_trip": "the Streams layer's send, and its receive in the same process",
}


async def cpu_per_call(call: Callable[[], Awaitable[Any]]) -> float:
    runs = []
    for _ in range(RUNS):
        await call()
        started = time.process_time()
        for _ in range(CALLS):
            await call()
        runs.append((time.process_time() - started) / CALLS * 1e6)
    return round(statistics.median(runs), 1)


async def measure(port: int) -> dict[str, float]:
    import hiredis
    from acp_channels._streams_layer import StreamsChannelLayer
    from redis.asyncio import Redis

    url = f"redis://127.0.0.1:{port}/0"
    redis = Redis.from_url(url)
    script = redis.register_script("return 1")
    await script(keys=["k"], args=[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    parser = hiredis.Reader()

    async def raw() -> Any:
        writer.write(hiredis.pack_command(("EVALSHA", script.sha, 1, "k", 1, 2, 3)))
        while True:
            parser.feed(await reader.read(65536))
            reply = parser.gets()
            if reply is not False:
                return reply

    layer = StreamsChannelLayer(hosts=[url], prefix="bench-cost", channel_capacity={"bench.*": 100000})
    channel = await layer.new_channel("bench.worker")
    message = {"type": "acp.push", "lease": "l-1", "seq": 1, "first": 1, "items": ['{"jsonrpc":"2.0","id":1}']}

    async def round_trip() -> None:
        await layer.send(channel, message)
        await layer.receive(channel)

    sent: list[None] = []

    async def send() -> None:
        await layer.send(channel, message)
        sent.append(None)
        if len(sent) >= 1000:  # keep the channel under its capacity
            sent.clear()
            await layer.redis().delete(layer._stream(channel))

    figures = {
        "raw": await cpu_per_call(raw),
        "ping": await cpu_per_call(redis.ping),
        "evalsha": await cpu_per_call(lambda: redis.evalsha(script.sha, 1, "k", 1, 2, 3)),
        "script": await cpu_per_call(lambda: script(keys=["k"], args=[1, 2, 3])),
        "layer_send": await cpu_per_call(send),
        "layer_round_trip": await cpu_per_call(round_trip),
    }
    writer.close()
    await layer.flush()
    await layer.close_pools()
    await redis.aclose()
    return figures


def render(stored: dict[str, Any]) -> str:
    runs = list(stored.values())
    lines = [
        "# What one message costs through Redis",
        "",
        "Written by `python -m bench.redis_cost` from `redis-cost.json` (see its docstring): this",
        "process's CPU per call in microseconds, medians of 3 runs of 3,000 calls, Redis on CPU 0.",
        "",
        "| call | " + " | ".join(f"{run['label']} ({run['commit']}, {run['date']})" for run in runs) + " |",
        "|---|" + "--:|" * len(runs),
    ]
    for key, label in ROWS.items():
        lines.append(f"| {label} | " + " | ".join(str(run["figures"].get(key, "—")) for run in runs) + " |")
    # An echo turn through a runner is two messages since session 36, each a send and a receive
    # (docs/runners.md, "What it costs"): the client CPU of the transport alone.
    cells = [
        str(round(2 * run["figures"]["layer_round_trip"])) if "layer_round_trip" in run["figures"] else "—"
        for run in runs
    ]
    lines.append(
        "| an echo turn: the request, then its answer and output in one batch "
        "(2 x the layer's send and receive) | " + " | ".join(cells) + " |"
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    from bench.cluster_hop import commit_of
    from bench.servers import Redis

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--render", action="store_true", help="only write REDIS-COST.md from redis-cost.json")
    args = parser.parse_args()
    stored: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if not args.render:
        os.sched_setaffinity(0, {LOADGEN_CPU})
        redis = Redis()
        redis.start()
        try:
            figures = asyncio.run(measure(redis.redis_port))
        finally:
            redis.stop()
        stored[args.label] = {
            "label": args.label,
            "commit": commit_of(HERE.parent),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "figures": figures,
        }
        RESULTS.write_text(json.dumps(stored, indent=1) + "\n")
        print(json.dumps(figures))
    REPORT.write_text(render(stored))
    print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()
