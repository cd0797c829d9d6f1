"""What one HTTP echo turn costs the server in-process: the demo's ASGI application driven
directly (no server, no sockets), so only Django, acp_channels and the agent are measured.

    .venv/bin/python -m bench.turn_cost                    # CPU time per turn (best of 8 batches)
    .venv/bin/python -m bench.turn_cost --profile out.prof # the same under cProfile (pstats file)
    .venv/bin/python -m bench.turn_cost --instructions     # instructions per turn (callgrind)

A turn is what bench.run's *rtt* scenario does over HTTP: POST `session/prompt` with
`echo r<i>` (202), then the chunk and the reply read from the session's SSE stream, which
stays open. `--instructions` runs this module under `valgrind --tool=callgrind` at two sizes and
divides the difference by the extra turns: a count that does not depend on what else the machine
is doing (CPU time here drifts by tens of percent), for before/after comparisons of one change.
Run it from the repository root; `BENCH_CODE_ROOT` measures another checkout's acp_channels.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(os.environ.get("BENCH_CODE_ROOT") or Path(__file__).resolve().parent.parent)
HOST = (b"host", b"127.0.0.1:8000")
JSON = {"content-type": "application/json"}
SSE = {"accept": "text/event-stream"}


def scope(method: str, headers: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": "/acp",
        "raw_path": b"/acp",
        "query_string": b"",
        "root_path": "",
        "headers": [HOST, *((name.encode(), value.encode()) for name, value in headers.items())],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }


class Turns:
    """A connection of the demo application with its connection and session streams open."""

    def __init__(self, application: Any) -> None:
        self.application = application
        self.streams: dict[str, bytearray] = {}
        self.arrived = asyncio.Event()
        self.readers: list[asyncio.Task[None]] = []

    async def request(self, method: str, headers: dict[str, str], body: bytes = b"") -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []
        pending = [{"type": "http.request", "body": body, "more_body": False}]
        client_stays = asyncio.Event()

        async def receive() -> dict[str, Any]:
            if pending:
                return pending.pop()
            await client_stays.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.application(scope(method, headers), receive, send)
        return sent

    def open_stream(self, name: str, headers: dict[str, str]) -> None:
        buffer = self.streams[name] = bytearray()
        client_stays = asyncio.Event()
        requested = [False]

        async def receive() -> dict[str, Any]:
            if not requested[0]:
                requested[0] = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await client_stays.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                buffer.extend(message.get("body", b""))
                self.arrived.set()

        self.readers.append(asyncio.ensure_future(self.application(scope("GET", {**SSE, **headers}), receive, send)))

    async def until(self, name: str, needle: bytes) -> bytes:
        """Wait for `needle` on a stream; returns what follows it and drops what came before."""
        buffer = self.streams[name]
        while (at := buffer.find(needle)) < 0:
            self.arrived.clear()
            await self.arrived.wait()
        rest = bytes(buffer[at + len(needle) :])
        del buffer[:]
        return rest

    async def open(self) -> str:
        initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
        reply = await self.request("POST", JSON, orjson.dumps(initialize))
        connection_id = dict(reply[0]["headers"])[b"acp-connection-id"].decode()
        self.headers = {**JSON, "acp-connection-id": connection_id}
        self.open_stream("connection", {"acp-connection-id": connection_id})
        new_session = {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": "/tmp", "mcpServers": []}}
        await self.request("POST", self.headers, orjson.dumps(new_session))
        rest = await self.until("connection", b'"sessionId":"')
        self.session_id = rest[: rest.index(b'"')].decode()
        self.headers["acp-session-id"] = self.session_id
        self.open_stream("session", {"acp-connection-id": connection_id, "acp-session-id": self.session_id})
        return self.session_id

    async def turn(self, index: int) -> None:
        prompt = {
            "jsonrpc": "2.0",
            "id": 10 + index,
            "method": "session/prompt",
            "params": {"sessionId": self.session_id, "prompt": [{"type": "text", "text": f"echo r{index}"}]},
        }
        reply = await self.request("POST", self.headers, orjson.dumps(prompt))
        if reply[0]["status"] != 202:
            raise AssertionError(f"POST answered {reply[0]}")
        await self.until("session", b'"stopReason":"end_turn"')


async def measure(turns: int, batches: int, profile: str | None) -> float:
    """The best CPU time per turn over `batches` batches, in seconds."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
    sys.path.insert(0, str(ROOT))
    from demo_project.asgi import application

    connection = Turns(application)
    await connection.open()
    for index in range(100):  # warm-up
        await connection.turn(index)
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    best = float("inf")
    per_batch = max(1, turns // batches)
    for _ in range(batches):
        started = time.process_time()
        for index in range(per_batch):
            await connection.turn(index)
        best = min(best, (time.process_time() - started) / per_batch)
    if profiler is not None and profile:
        profiler.disable()
        profiler.dump_stats(profile)
    return best


def instructions(turns: int) -> int:
    """Instructions per turn: callgrind totals at `turns` and 3 x `turns`, differenced."""
    totals = []
    for count in (turns, 3 * turns):
        run = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                "-m",
                "bench.turn_cost",
                "--turns",
                str(count),
                "--batches",
                "1",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
            check=True,
        )
        found = re.search(r"Collected : (\d+)", run.stderr)
        if found is None:
            raise RuntimeError(run.stderr[-2000:])
        totals.append(int(found.group(1)))
    return (totals[1] - totals[0]) // (2 * turns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=4000)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile (pstats) file of the measured turns")
    parser.add_argument("--instructions", action="store_true", help="instructions per turn, under callgrind")
    args = parser.parse_args()
    if args.instructions:
        print(f"{instructions(min(args.turns, 200)):,} instructions per turn")
        return
    try:
        import uvloop

        best = uvloop.run(measure(args.turns, args.batches, args.profile))
    except ImportError:
        best = asyncio.run(measure(args.turns, args.batches, args.profile))
    print(f"{best * 1e6:.0f} us of CPU per turn (best of {args.batches} batches of {args.turns // args.batches})")


if __name__ == "__main__":
    main()
