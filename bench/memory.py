"""What a connection costs in memory: bench/memory.json and bench/MEMORY.md.

    .venv/bin/python -m bench.memory            # one run (about 2 minutes)
    .venv/bin/python -m bench.memory --render   # MEMORY.md again from memory.json
    .venv/bin/python -m bench.memory --profile  # only the breakdown (about 2 minutes)

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

*Where it goes* (`--profile`, also part of a full run): ours on daphne again, under tracemalloc
(bench/traced_daphne.py), with a snapshot before and after each step; each allocation made
during a step and still alive is charged to the package of the nearest frame outside the
standard library (an `asyncio.Queue` made by daphne is daphne's), per client.
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
PROFILE_CLIENTS = 100
#: Who holds a connection's memory: top-level package -> the row it is charged to.
OWNERS = {
    "acp_channels": "acp_channels",
    "demo_project": "the demo agent",
    "acp": "ACP Python SDK + pydantic",
    "pydantic": "ACP Python SDK + pydantic",
    "pydantic_core": "ACP Python SDK + pydantic",
    "daphne": "daphne + Twisted + autobahn",
    "twisted": "daphne + Twisted + autobahn",
    "autobahn": "daphne + Twisted + autobahn",
    "txaio": "daphne + Twisted + autobahn",
    "zope": "daphne + Twisted + autobahn",
    "django": "Django + asgiref",
    "asgiref": "Django + asgiref",
    "channels": "channels",
}
OWNER_ROWS = list(dict.fromkeys([*OWNERS.values(), "other", "standard library only"]))


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
        factory = (
            (lambda: HttpAcp(server.url, **server.client_options))
            if transport == "http"
            else (lambda: WsAcp(server.url, **server.client_options))
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


def owner_of(traceback: Any) -> str:
    """The row an allocation is charged to: the nearest frame (most recent first) in a package."""
    for frame in reversed(list(traceback)):
        path = frame.filename
        if "site-packages/" in path:
            top = path.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
            return OWNERS.get(top, "other")
        for package in ("acp_channels", "demo_project"):
            if f"/{package}/" in path:
                return OWNERS[package]
    return "standard library only"


def charged(before: Any, after: Any, clients: int) -> dict[str, float]:
    """Bytes per client still allocated after a step, by owner row."""
    rows = dict.fromkeys(OWNER_ROWS, 0.0)
    for stat in after.compare_to(before, "traceback"):
        rows[owner_of(stat.traceback)] += stat.size_diff / clients
    return rows


async def profile(transport: str) -> dict[str, dict[str, float]]:
    """Where a connection's and a session's memory goes, ours on daphne (see the docstring)."""
    import signal
    import tempfile
    import tracemalloc

    from bench.client import HttpAcp, WsAcp
    from bench.servers import daphne

    proc = daphne("daphne, traced", "demo_project.asgi:application")
    proc.command[1:3] = ["-m", "bench.traced_daphne"]
    out = Path(tempfile.mkdtemp(prefix="acp-memory-")) / "snapshot"
    proc.env["BENCH_TRACE_OUT"] = str(out)
    proc.start(timeout=180)
    try:
        url = f"http://127.0.0.1:{proc.port}/acp"
        factory = (lambda: HttpAcp(url)) if transport == "http" else (lambda: WsAcp(url))

        async def snapshot(number: int) -> Any:
            os.kill(proc.pid, signal.SIGUSR1)
            # The server prints the line once the file is on disk (read by Proc's reader thread).
            while f"TRACED {number}\n" not in proc.log:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            return tracemalloc.Snapshot.load(f"{out}.{number}")

        for _ in range(20):
            client = factory()
            await client.open()
            await client.new_session()
            await client.close()
        start = await snapshot(1)
        clients = [factory() for _ in range(PROFILE_CLIENTS)]
        for client in clients:
            await client.open()
        opened = await snapshot(2)
        for client in clients:
            await client.new_session()
        with_sessions = await snapshot(3)
        for client in clients:
            await client.close()
        return {
            "connection": charged(start, opened, PROFILE_CLIENTS),
            "session": charged(opened, with_sessions, PROFILE_CLIENTS),
        }
    finally:
        proc.stop()
        for path in out.parent.iterdir():
            path.unlink()
        out.parent.rmdir()


async def run_profile() -> dict[str, Any]:
    from bench.run import log

    breakdown = {}
    for transport in ("http", "ws"):
        breakdown[transport] = done = await profile(transport)
        log(
            f"  profile {transport}: {sum(done['connection'].values()) / 1024:.0f} KiB per connection, "
            f"{sum(done['session'].values()) / 1024:.0f} KiB per session"
        )
    return {
        "commit": __import__("bench.cluster_hop", fromlist=["commit_of"]).commit_of(HERE.parent),
        "clients": PROFILE_CLIENTS,
        "breakdown": breakdown,
    }


async def run() -> dict[str, Any]:
    from bench.cluster_hop import commit_of
    from bench.run import LOADGEN_CPU, log

    os.sched_setaffinity(0, {LOADGEN_CPU})
    results: dict[str, Any] = {}
    for key in SERVER_KEYS:
        for transport in ("http", "ws"):
            try:
                results.setdefault(key, {})[transport] = done = await measure(key, transport)
                log(
                    f"  {key} {transport}: {done['connection_kib']:.0f} KiB per connection, "
                    f"{done['session_kib']:.0f} KiB per session"
                )
            except Exception as error:
                results.setdefault(key, {})[transport] = {"error": f"{type(error).__name__}: {error}"}
                log(f"  {key} {transport}: FAILED {error}")
    return {
        "commit": commit_of(HERE.parent),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "clients": CLIENTS,
        "servers": results,
        "profile": await run_profile(),
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
        lines.append(
            f"| {SERVERS[key].label} | {' | '.join(cells)} | {base:.0f} |"
            if base
            else f"| {SERVERS[key].label} | {' | '.join(cells)} | |"
        )
    if "profile" in data:
        lines += render_profile(data["profile"])
    return "\n".join(lines) + "\n"


def render_profile(profile: dict[str, Any]) -> list[str]:
    breakdown = profile["breakdown"]
    columns = [(transport, step) for transport in ("http", "ws") for step in ("connection", "session")]
    lines = [
        "",
        "## Where it goes",
        "",
        f"Ours on daphne under tracemalloc (`--profile`, on {profile['commit']}, {profile['clients']} "
        "clients): Python allocations made during each step and still alive after it, per client, "
        "charged to the package of the nearest frame outside the standard library. Python's "
        "allocations only (no allocator slack), so the totals are lower than the growth above.",
        "",
        "| held by | HTTP connection KiB | HTTP session KiB | WS connection KiB | WS session KiB |",
        "|---|--:|--:|--:|--:|",
    ]
    for row in OWNER_ROWS:
        cells = [breakdown[transport][step].get(row, 0.0) / 1024 for transport, step in columns]
        if any(abs(cell) >= 0.05 for cell in cells):
            lines.append(f"| {row} | " + " | ".join(f"{cell:.1f}" for cell in cells) + " |")
    totals = [sum(breakdown[transport][step].values()) / 1024 for transport, step in columns]
    lines.append("| **total** | " + " | ".join(f"**{total:.1f}**" for total in totals) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--render", action="store_true", help="only write MEMORY.md from memory.json")
    parser.add_argument("--profile", action="store_true", help="only the breakdown, into memory.json")
    args = parser.parse_args()
    if args.profile:
        import uvloop

        data = json.loads(RESULTS.read_text())
        data["profile"] = uvloop.run(run_profile())
        RESULTS.write_text(json.dumps(data, indent=1) + "\n")
    elif not args.render:
        import uvloop

        RESULTS.write_text(json.dumps(uvloop.run(run()), indent=1) + "\n")
    REPORT.write_text(render(json.loads(RESULTS.read_text())))
    print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()
