"""What a connection costs in memory: bench/memory.json and bench/MEMORY.md.

    .venv/bin/python -m bench.memory            # one run (about 2 minutes)
    .venv/bin/python -m bench.memory --render   # MEMORY.md again from memory.json

Each server (bench.servers, pinned as bench.run) is started fresh, warmed with 20 connections
that come and go, then gets CLIENTS clients, held open, in two steps:

- *connection*: over HTTP initialize and the connection's SSE stream; over WebSocket the
  upgrade and initialize;
- *session*: then session/new on each, and over HTTP the session's SSE stream.

The resident memory of the server's processes (summed, /proc) is read before and after each
step, once it has stopped growing (sampled every 100 ms until two readings 300 ms apart agree
within 64 KiB); the cost per client is the growth divided by CLIENTS. Resident memory moves with
the allocator (freed memory is not always handed back), so the figures are approximate: compare
the servers in one run with each other.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "memory.json"
REPORT = HERE / "MEMORY.md"
CLIENTS = 200
SERVER_KEYS = ["ours-daphne", "ours-uvicorn", "ts-sdk", "py-sdk-uvicorn"]


async def settled_rss(pids: list[int]) -> int:
    """The servers' RSS once it stopped changing (a benchmark may sample; tests never do)."""
    from bench.servers import rss_bytes

    previous = rss_bytes(pids)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        now = rss_bytes(pids)
        if abs(now - previous) < 64 * 1024:
            return now
        previous = now
    return previous


async def measure(key: str, transport: str) -> dict[str, Any]:
    from bench.client import HttpAcp, WsAcp
    from bench.servers import SERVERS

    server = SERVERS[key]().start()
    try:
        factory = (lambda: HttpAcp(server.url, **server.client_options)) if transport == "http" else (
            lambda: WsAcp(server.url, **server.client_options)
        )
        for _ in range(20):  # warm: imports, first allocations
            client = factory()
            await client.open()
            await client.new_session()
            await client.close()
        pids = server.pids()
        start = await settled_rss(pids)
        clients = [factory() for _ in range(CLIENTS)]
        for client in clients:
            await client.open()
        opened = await settled_rss(pids)
        for client in clients:
            await client.new_session()
        with_sessions = await settled_rss(pids)
        for client in clients:
            await client.close()
        return {
            "connection_kib": (opened - start) / CLIENTS / 1024,
            "session_kib": (with_sessions - opened) / CLIENTS / 1024,
            "base_mib": start / 2**20,
        }
    finally:
        server.stop()


async def run() -> dict[str, Any]:
    from bench.cluster_hop import commit_of
    from bench.run import LOADGEN_CPU, log

    os.sched_setaffinity(0, {LOADGEN_CPU})
    results: dict[str, Any] = {}
    for key in SERVER_KEYS:
        for transport in ("http", "ws"):
            try:
                results.setdefault(key, {})[transport] = done = await measure(key, transport)
                log(f"  {key} {transport}: {done['connection_kib']:.0f} KiB per connection, "
                    f"{done['session_kib']:.0f} KiB per session")
            except Exception as error:
                results.setdefault(key, {})[transport] = {"error": f"{type(error).__name__}: {error}"}
                log(f"  {key} {transport}: FAILED {error}")
    return {
        "commit": commit_of(HERE.parent),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "clients": CLIENTS,
        "servers": results,
    }


def render(data: dict[str, Any]) -> str:
    from bench.servers import SERVERS

    lines = [
        "# What a connection costs in memory",
        "",
        f"Written by `python -m bench.memory` from `memory.json` (see the module's docstring) on "
        f"{data['commit']}, {data['date']}: {data['clients']} clients held open on a fresh server; "
        "growth of the server processes' resident memory per client. *connection*: over HTTP "
        "initialize and the connection stream, over WebSocket the socket and initialize; *session*: "
        "session/new, and over HTTP its stream. Approximate (allocator): compare within the table.",
        "",
        "| server | HTTP connection KiB | HTTP session KiB | WS connection KiB | WS session KiB | idle RSS MiB |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for key, transports in data["servers"].items():
        cells = []
        for transport in ("http", "ws"):
            done = transports.get(transport, {})
            if "error" in done:
                cells += [done["error"][:40], ""]
            else:
                cells += [f"{done['connection_kib']:.0f}", f"{done['session_kib']:.0f}"]
        base = transports.get("http", {}).get("base_mib")
        lines.append(f"| {SERVERS[key].label} | {' | '.join(cells)} | {base:.0f} |" if base else
                     f"| {SERVERS[key].label} | {' | '.join(cells)} | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--render", action="store_true", help="only write MEMORY.md from memory.json")
    args = parser.parse_args()
    if not args.render:
        import uvloop

        RESULTS.write_text(json.dumps(uvloop.run(run()), indent=1) + "\n")
    REPORT.write_text(render(json.loads(RESULTS.read_text())))
    print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()
