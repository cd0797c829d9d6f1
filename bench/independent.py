"""Two load generators against the same servers: bench/independent.json and bench/INDEPENDENT.md.

    .venv/bin/python -m bench.independent            # about 5 minutes
    .venv/bin/python -m bench.independent --render   # INDEPENDENT.md again from the json

Issue 14 quoted an independent measurement (another load generator, the plain serving command
`daphne -b 127.0.0.1 -p PORT demo_project.asgi:application`, server and generator pinned to one
core each, medians of 3 after warm-up) that put us lower than bench.run does. This runs both
ways on the same server processes, interleaved, so the differences can be told apart:

- *bench*: bench/client.py (raw asyncio HTTP/1.1 and WebSocket, uvloop, orjson) with
  bench.run's sizes: streams of 20,000 chunks, 2,000 echo turns; warm-up as bench.run.
- *node*: bench/independent_client.mjs, written separately on Node's own fetch (undici) and the
  `ws` package: streams of 100,000 chunks after a 50,000-chunk warm-up, 2,000 echo turns after
  200.

Servers: ours under the plain command (`ours-plain`), ours as bench.run starts it (endpoint
string with backlog 2048, WebSocket size flags: `ours-daphne`), the TS SDK server and the Python
SDK server on daphne (which streams a tenth as much: it makes about 6,000 msg/s). Each round
starts every server fresh, in a rotating order; three rounds; the tables give medians over
rounds (each round's value is itself the median of its reps).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "independent.json"
REPORT = HERE / "INDEPENDENT.md"
ROUNDS = 3
BENCH_SIZES = {"stream": 20000, "stream_warmup": 20000, "rtt": 2000, "rtt_warmup": 200, "reps": 3}
NODE_SIZES = {"stream": 100000, "stream_warmup": 50000, "rtt": 2000, "rtt_warmup": 200, "reps": 3}
SERVER_KEYS = ["ours-plain", "ours-daphne", "ts-sdk", "py-sdk-daphne"]
#: Servers an order of magnitude slower at streaming stream a tenth as much (their rtt is the point).
STREAM_SHARE = {"py-sdk-daphne": 0.1}
LABELS = {
    "ours-plain": "ours, `daphne -b 127.0.0.1 -p PORT`",
    "ours-daphne": "ours, daphne as bench.run starts it",
    "ts-sdk": "TS SDK, Node",
    "py-sdk-daphne": "Python SDK, daphne",
}


def make_server(key: str) -> Any:
    from bench.servers import DAPHNE_READY, SERVERS, Proc, Server, free_port

    if key != "ours-plain":
        return SERVERS[key]()
    server = Server()
    port = free_port()
    server.procs = [
        Proc(
            "daphne (plain)",
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "demo_project.asgi:application"],
            DAPHNE_READY,
        )
    ]
    return server


async def bench_generator(key: str, server: Any, transport: str) -> dict[str, float]:
    from bench.client import make_client
    from bench.scenarios import run_rtt, run_stream

    share = STREAM_SHARE.get(key, 1.0)
    client = make_client(transport, server.url, **server.client_options)
    await client.open()
    await client.new_session()
    try:
        await run_stream(client, int(BENCH_SIZES["stream_warmup"] * share))
        count = int(BENCH_SIZES["stream"] * share)
        streams = [(await run_stream(client, count))["msg_per_s"] for _ in range(BENCH_SIZES["reps"])]
        await run_rtt(client, BENCH_SIZES["rtt_warmup"])
        rtts = [statistics.median(await run_rtt(client, BENCH_SIZES["rtt"])) * 1000 for _ in range(BENCH_SIZES["reps"])]
    finally:
        await client.close()
    return {"stream": statistics.median(streams), "rtt_ms": statistics.median(rtts)}


def node_generator(key: str, server: Any, transport: str) -> dict[str, float]:
    from bench.run import LOADGEN_CPU

    share = STREAM_SHARE.get(key, 1.0)
    out: dict[str, float] = {}
    for scenario, metric, count, warmup in (
        ("stream", "stream", int(NODE_SIZES["stream"] * share), int(NODE_SIZES["stream_warmup"] * share)),
        ("rtt", "rtt_ms", NODE_SIZES["rtt"], NODE_SIZES["rtt_warmup"]),
    ):
        done = subprocess.run(
            [
                "taskset",
                "-c",
                str(LOADGEN_CPU),
                "node",
                str(HERE / "independent_client.mjs"),
                server.url,
                transport,
                scenario,
                str(count),
                str(NODE_SIZES["reps"]),
                str(warmup),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        out[metric] = statistics.median(json.loads(done.stdout.strip().splitlines()[-1])["samples"])
    return out


async def run() -> dict[str, Any]:
    from bench.cluster_hop import commit_of
    from bench.run import LOADGEN_CPU, log

    os.sched_setaffinity(0, {LOADGEN_CPU})
    load_before = " ".join(f"{value:.2f}" for value in os.getloadavg())
    rounds: list[dict[str, Any]] = []
    for number in range(ROUNDS):
        order = SERVER_KEYS[number % len(SERVER_KEYS) :] + SERVER_KEYS[: number % len(SERVER_KEYS)]
        measured: dict[str, Any] = {}
        for key in order:
            server = make_server(key).start()
            try:
                for transport in ("http", "ws"):
                    measured.setdefault(key, {})[transport] = done = {
                        "bench": await bench_generator(key, server, transport),
                        "node": await asyncio.to_thread(node_generator, key, server, transport),
                    }
                    log(
                        f"  round {number + 1} {key} {transport}: "
                        + ", ".join(
                            f"{generator} {values['stream']:,.0f} msg/s rtt {values['rtt_ms']:.2f} ms"
                            for generator, values in done.items()
                        )
                    )
            finally:
                server.stop()
        rounds.append(measured)
    return {
        "commit": commit_of(HERE.parent),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "bench_sizes": BENCH_SIZES,
        "node_sizes": NODE_SIZES,
        "rounds": rounds,
        "load": f"{load_before} -> " + " ".join(f"{value:.2f}" for value in os.getloadavg()),
    }


def median_of(data: dict[str, Any], key: str, transport: str, generator: str, metric: str) -> float:
    return statistics.median(measured[key][transport][generator][metric] for measured in data["rounds"])


def render(data: dict[str, Any]) -> str:
    lines = [
        "# Two load generators, the same servers",
        "",
        f"Written by `python -m bench.independent` from `independent.json` (see the module's docstring) on "
        f"{data['commit']}, {data['date']}: {len(data['rounds'])} rounds, servers started fresh each round "
        "and pinned to CPU 0, the generators to CPU 1. *bench*: bench/client.py at bench.run's sizes "
        f"({data['bench_sizes']['stream']:,}-chunk streams); *node*: bench/independent_client.mjs "
        f"({data['node_sizes']['stream']:,}-chunk streams after a {data['node_sizes']['stream_warmup']:,}-chunk "
        "warm-up). Medians over rounds; ratios against the TS SDK server (streams) and the Python SDK "
        f"server on daphne (rtt), within one generator. Load average before and after: {data.get('load', '?')}.",
        "",
        "| server | generator | stream HTTP msg/s | stream WS msg/s | rtt HTTP p50 ms | rtt WS p50 ms |",
        "|---|---|--:|--:|--:|--:|",
    ]
    for key in SERVER_KEYS:
        for generator in ("bench", "node"):
            cells = []
            for metric, peer in (("stream", "ts-sdk"), ("rtt_ms", "py-sdk-daphne")):
                for transport in ("http", "ws"):
                    value = median_of(data, key, transport, generator, metric)
                    ratio = value / median_of(data, peer, transport, generator, metric)
                    text = f"{value:,.0f}" if metric == "stream" else f"{value:.2f}"
                    cells.append(text if key == peer else f"{text} ({ratio:.2f}x)")
            lines.append(f"| {LABELS[key]} | {generator} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--render", action="store_true", help="only write INDEPENDENT.md from independent.json")
    args = parser.parse_args()
    if not args.render:
        import uvloop

        RESULTS.write_text(json.dumps(uvloop.run(run()), indent=1) + "\n")
    REPORT.write_text(render(json.loads(RESULTS.read_text())))
    print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()
