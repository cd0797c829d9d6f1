"""What the stdio bridge costs: the same client driving the demo agent directly (HttpClient) and
through `python -m acp_channels.bridge URL` (newline-delimited JSON-RPC on its stdin/stdout).

    .venv/bin/python -m bench.bridge            # 1.5-2.5 minutes -> bench/bridge.json, bench/BRIDGE.md
    .venv/bin/python -m bench.bridge --quick    # one repetition, 300 echo turns (20-35 s)
    .venv/bin/python -m bench.bridge --report   # re-render BRIDGE.md from bridge.json

One daphne serving demo_project.asgi:application on loopback, pinned to CPU 0. This process (the
"editor") and the bridge it spawns run on CPU 1: the bridge is the editor's side of the wire.
Per transport (HTTP+SSE, WebSocket) both paths stay connected for the whole run and are measured
interleaved: rtt = sequential `echo r<i>` prompts (prompt sent -> reply received), the paths
alternating every RTT_BLOCK turns; stream = one prompt `stream N 64` (messages/s from the
prompt until its reply), twice per path and repetition, in the order A B B A. Every message is
checked. Medians of the repetitions; see bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from acp_channels import _protocol as protocol
from acp_channels.client import HttpClient

from bench.run import LOADGEN_CPU, log, machine, percentiles, summarize, versions
from bench.servers import SERVER_CPU, OursDaphne

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CHUNK = 64
FULL = {"warmup_stream": 20000, "warmup_rtt": 200, "rtt": 1000, "stream": 20000, "reps": 3}
QUICK = {"warmup_stream": 5000, "warmup_rtt": 100, "rtt": 300, "stream": 20000, "reps": 1}
TRANSPORTS = {"http": "HTTP+SSE", "ws": "WebSocket"}
PATHS = ("direct", "bridge")
#: Echo turns per block; the paths alternate block by block.
RTT_BLOCK = 50
#: Whose CPU time is measured.
WHO = ("server", "driver", "bridge")
#: Deadline of one whole scenario (a hang fails the run instead of stalling it).
SCENARIO_TIMEOUT = 120.0
_CLOCK_TICK = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    """A message was lost, reordered, unexpected, or a process misbehaved."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (10 ms resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICK


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (user, nice, system, irq, softirq)."""
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in Path("/proc/stat").read_text().split()[1:8])
    return (user + nice + system + irq + softirq) / _CLOCK_TICK


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of its children that were waited for (server, bridges)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Link(Protocol):
    """One way for the driver to exchange JSON-RPC messages with the remote agent."""

    async def send(self, message: dict[str, Any]) -> None: ...

    async def receive(self) -> dict[str, Any]: ...

    def client_cpu(self) -> float:
        """CPU seconds used so far on the client side by what this link adds to the driver."""
        ...

    async def close(self) -> None: ...


class DirectLink:
    """The driver speaks to the server itself, through HttpClient (as an editor embedding it would)."""

    def __init__(self, url: str) -> None:
        self.client = HttpClient(url)

    async def send(self, message: dict[str, Any]) -> None:
        await self.client.send(message)

    async def receive(self) -> dict[str, Any]:
        message = await self.client.receive()
        if message is None:
            raise BenchError("the client was closed")
        return message

    def client_cpu(self) -> float:
        return 0.0

    async def close(self) -> None:
        await self.client.close()


class BridgeLink:
    """The driver speaks newline-delimited JSON-RPC to a bridge subprocess, as an editor does.

    Received lines are parsed with the parser HttpClient uses, so the driver does per message
    what the direct path does, and the difference is the bridge."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.stderr: list[str] = []
        assert process.stderr is not None
        self._stderr_task = asyncio.create_task(self._collect_stderr(process.stderr))

    @classmethod
    async def start(cls, url: str) -> BridgeLink:
        # The child inherits this process's affinity (CPU 1).
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "acp_channels.bridge", url,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=ROOT, limit=64 * 1024 * 1024,
        )  # fmt: skip
        return cls(process)

    async def _collect_stderr(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.stderr.append(line.decode(errors="replace").rstrip())

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(protocol.dumps(message).encode() + b"\n")
        await self.process.stdin.drain()

    async def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await self.process.stdout.readline()
        if not line:
            raise BenchError(f"the bridge's stdout ended (exit {self.process.returncode}): {self.stderr[-3:]}")
        frame = protocol.parse_frame(line.decode())
        value = protocol.frame_value(frame) if not isinstance(frame, protocol.Malformed) else frame.error
        if not isinstance(value, dict):
            raise BenchError(f"not one message: {line[:200]!r}")
        return value

    def client_cpu(self) -> float:
        return cpu_seconds(self.process.pid)

    async def close(self) -> None:
        """Close stdin as an editor does; the bridge must DELETE and exit 0 with nothing left over."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        rest = await asyncio.wait_for(self.process.stdout.read(), 30)
        status = await asyncio.wait_for(self.process.wait(), 30)
        await self._stderr_task
        if rest or status != 0:
            raise BenchError(f"bridge exit {status}, left over {rest[:200]!r}, stderr {self.stderr[-3:]}")


class Session:
    """One connection and session on a link, with the driver's request ids."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.session_id = ""
        self._next_id = 0

    def next_id(self) -> int:
        self._next_id += 1
        return self._next_id

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = self.next_id()
        await self.link.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        reply = await self.link.receive()
        if reply.get("id") != request_id or "result" not in reply:
            raise BenchError(f"{method}: {str(reply)[:300]}")
        result: dict[str, Any] = reply["result"]
        return result

    async def open(self) -> None:
        async with asyncio.timeout(30):
            await self.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            self.session_id = (await self.call("session/new", {"cwd": str(ROOT), "mcpServers": []}))["sessionId"]

    def prompt(self, request_id: int, text: str) -> dict[str, Any]:
        return {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "session/prompt",
            "params": {"sessionId": self.session_id, "prompt": [{"type": "text", "text": text}]},
        }

    async def _until_reply(self, request_id: int, on_chunk: Callable[[str], None]) -> None:
        while True:
            message = await self.link.receive()
            if message.get("method") == "session/update":
                on_chunk(message["params"]["update"]["content"]["text"])
            elif message.get("id") == request_id and "method" not in message:
                if message.get("result", {}).get("stopReason") != "end_turn":
                    raise BenchError(f"prompt reply: {str(message)[:300]}")
                return
            else:
                raise BenchError(f"unexpected: {str(message)[:300]}")

    async def rtt(self, count: int) -> list[float]:
        """Sequential `echo r<i>` turns: seconds from sending the prompt until its reply."""
        samples = []
        async with asyncio.timeout(SCENARIO_TIMEOUT):
            for index in range(count):
                want = f"r{index}"
                got: list[str] = []
                request_id = self.next_id()
                started = time.perf_counter()
                await self.link.send(self.prompt(request_id, f"echo {want}"))
                await self._until_reply(request_id, got.append)
                samples.append(time.perf_counter() - started)
                if got != [want]:
                    raise BenchError(f"echo turn {index}: chunks {got[:3]} where [{want!r}] was due")
        return samples

    async def stream(self, count: int) -> float:
        """One prompt streaming `count` chunks: seconds from sending it until its reply; checks
        every chunk index arrives once and in order, each CHUNK characters, before the reply."""
        width = len(str(max(count - 1, 0)))
        expected = 0
        errors: list[str] = []

        def on_chunk(text: str) -> None:
            nonlocal expected
            if len(text) != CHUNK or text[:width] != f"{expected:0{width}d}" or text[width] != ":":
                if len(errors) < 3:
                    errors.append(f"{text[:12]!r} (length {len(text)}) where chunk {expected} was due")
            expected += 1

        request_id = self.next_id()
        async with asyncio.timeout(SCENARIO_TIMEOUT):
            started = time.perf_counter()
            await self.link.send(self.prompt(request_id, f"stream {count} {CHUNK}"))
            await self._until_reply(request_id, on_chunk)
            seconds = time.perf_counter() - started
        if errors or expected != count:
            raise BenchError(f"stream: {expected} of {count} chunks; {errors}")
        return seconds


class Meter:
    """CPU seconds used during a scenario by the server, this driver, and the bridge (if any)."""

    def __init__(self, server_pid: int, link: Link) -> None:
        self.server_pid = server_pid
        self.link = link

    def read(self) -> tuple[float, float, float]:
        return cpu_seconds(self.server_pid), time.process_time(), self.link.client_cpu()

    @staticmethod
    def spent(before: tuple[float, float, float], after: tuple[float, float, float]) -> dict[str, float]:
        server, driver, bridge = (b - a for a, b in zip(before, after, strict=True))
        return {"server": server, "driver": driver, "bridge": bridge}


async def measure_transport(url: str, server_pid: int, sizes: dict[str, Any]) -> dict[str, Any]:
    """Both paths on one transport: connect, warm up, then the repetitions interleaved."""
    links: dict[str, Link] = {"direct": DirectLink(url), "bridge": await BridgeLink.start(url)}
    sessions = {path: Session(link) for path, link in links.items()}
    raw: dict[str, dict[str, list[Any]]] = {path: {"rtt": [], "stream": [], "rtt_cpu": [], "stream_cpu": []}
                                            for path in links}  # fmt: skip
    try:
        for session in sessions.values():
            await session.open()
            await session.stream(sizes["warmup_stream"])
            await session.rtt(sizes["warmup_rtt"])
        for rep in range(sizes["reps"]):
            order = list(links) if rep % 2 == 0 else list(reversed(links))
            # Turns alternate between the paths in blocks, so both sample the same moments of
            # whatever else the machine does.
            samples: dict[str, list[float]] = {path: [] for path in links}
            spent: dict[str, list[dict[str, float]]] = {path: [] for path in links}
            for _ in range(sizes["rtt"] // RTT_BLOCK):
                for path in order:
                    meter = Meter(server_pid, links[path])
                    before = meter.read()
                    samples[path] += await sessions[path].rtt(RTT_BLOCK)
                    spent[path].append(Meter.spent(before, meter.read()))
            for path in order:
                raw[path]["rtt"].append(percentiles(samples[path]))
                raw[path]["rtt_cpu"].append({who: sum(block[who] for block in spent[path]) for who in WHO})
            # Two streams per path, A B B A: a drift in the machine's speed hits both alike.
            seconds: dict[str, list[float]] = {path: [] for path in links}
            stream_spent: dict[str, list[dict[str, float]]] = {path: [] for path in links}
            for path in [*order, *reversed(order)]:
                meter = Meter(server_pid, links[path])
                before = meter.read()
                seconds[path].append(await sessions[path].stream(sizes["stream"]))
                stream_spent[path].append(Meter.spent(before, meter.read()))
            for path in order:
                total = sum(seconds[path])
                messages = sizes["stream"] * len(seconds[path])
                raw[path]["stream"].append({"seconds": seconds[path], "msg_per_s": messages / total})
                raw[path]["stream_cpu"].append(
                    {who: sum(block[who] for block in stream_spent[path]) / len(seconds[path]) for who in WHO}
                )
            log(
                f"    rep {rep + 1}: "
                + ", ".join(
                    f"{path} rtt p50 {raw[path]['rtt'][-1]['p50']:.3f} ms, "
                    f"stream {raw[path]['stream'][-1]['msg_per_s']:,.0f} msg/s"
                    for path in links
                )
            )
    finally:
        for link in links.values():
            await link.close()
    out: dict[str, Any] = {}
    for path, got in raw.items():
        turns, messages = sizes["rtt"], sizes["stream"]
        out[path] = {
            "rtt_ms": summarize(got["rtt"]),
            "rtt_reps_ms": got["rtt"],
            "stream_msg_per_s": statistics.median(rep["msg_per_s"] for rep in got["stream"]),
            "stream_reps": got["stream"],
            # CPU per unit of work, median over repetitions, microseconds.
            "cpu_us_per_turn": {who: statistics.median(rep[who] for rep in got["rtt_cpu"]) / turns * 1e6
                                for who in WHO},
            "cpu_us_per_message": {who: statistics.median(rep[who] for rep in got["stream_cpu"]) / messages * 1e6
                                   for who in WHO},
        }  # fmt: skip
    out["ratio"] = {
        "rtt_p50": out["bridge"]["rtt_ms"]["p50"] / out["direct"]["rtt_ms"]["p50"],
        "rtt_p50_added_ms": out["bridge"]["rtt_ms"]["p50"] - out["direct"]["rtt_ms"]["p50"],
        "stream_rate": out["bridge"]["stream_msg_per_s"] / out["direct"]["stream_msg_per_s"],
        # The client side's CPU (driver, plus the bridge on its path): steadier than wall-clock
        # figures when other work shares the machine.
        **{
            f"client_{per}": _client_cpu(out["bridge"][per]) / _client_cpu(out["direct"][per])
            for per in ("cpu_us_per_turn", "cpu_us_per_message")
        },
    }
    return out


def _client_cpu(cpu: dict[str, float]) -> float:
    return cpu["driver"] + cpu["bridge"]


async def run(sizes: dict[str, Any]) -> dict[str, Any]:
    server = OursDaphne().start()
    results: dict[str, Any] = {"transports": {}}
    try:
        port, pid = server.procs[0].port, server.procs[0].pid
        for kind in TRANSPORTS:
            url = f"{'http' if kind == 'http' else 'ws'}://127.0.0.1:{port}/acp"
            log(f"  {TRANSPORTS[kind]}: {url}")
            results["transports"][kind] = await measure_transport(url, pid, sizes)
    finally:
        server.stop()
    if errors := server.errors():
        raise BenchError(f"server errors: {errors[:3]}")
    return results


# -- the report -----------------------------------------------------------------------------------


def _ms(rtt: dict[str, float]) -> str:
    return f"{rtt['p50']:.2f} / {rtt['p90']:.2f} / {rtt['p99']:.2f}"


def _cpu(cpu: dict[str, float], bridged: bool) -> str:
    client = f"{cpu['driver']:.0f}" + (f" + {cpu['bridge']:.0f}" if bridged else "")
    return f"{client} / {cpu['server']:.0f}"


def render(results: dict[str, Any]) -> str:
    """BRIDGE.md from a results dict: every figure comes from it."""
    meta = results["meta"]
    sizes = meta["sizes"]
    hw = meta["machine"]
    reps = sizes["reps"]
    lines = [
        "## The stdio bridge's overhead",
        "",
        f"Measured {meta['date']} on {hw['nproc']} × {hw['cpu']} ({hw['kernel']}), "
        f"acp-channels {meta['versions'].get('acp-channels commit', '?')}, Python {meta['versions']['python']}"
        f"{', quick run' if meta['quick'] else ''}. Server: daphne with the demo agent on CPU {meta['server_cpu']}; "
        f"the driver (this benchmark, standing for the editor) and the bridge process on CPU {meta['client_cpu']}. "
        f"Reproduce with `.venv/bin/python -m bench.bridge` ({meta['duration_s']} s); method in `bench/README.md`. "
        f"Other processes used {meta['other_cpu_share']:.0%} of the machine's CPU during the run: the ratios "
        "compare both paths under the same conditions, the absolute figures move with that load.",
        "",
        f"**direct**: the driver uses `HttpClient`. **bridge**: the same driver writes each message as a line "
        f"to `python -m acp_channels.bridge URL` and reads lines from it. **rtt**: {sizes['rtt']:,} sequential "
        f"`echo` prompts per path, prompt sent → reply received, the paths alternating every {meta['rtt_block']} "
        f"turns. **stream**: one prompt streaming {sizes['stream']:,} "
        f"chunks of {CHUNK} characters, messages/s from the prompt until its reply; two per path and repetition, "
        "direct, bridge, bridge, direct (or the reverse). "
        f"{'Medians of ' + str(reps) + ' repetitions' if reps > 1 else 'One repetition'} after a warm-up, "
        "on one server; every message checked.",
        "",
        "| transport | path | rtt p50 / p90 / p99 ms | stream msg/s | CPU µs per echo turn, client / server "
        "| CPU µs per streamed message, client / server |",
        "|---|---|--:|--:|--:|--:|",
    ]
    for kind, label in TRANSPORTS.items():
        entry = results["transports"][kind]
        for path in PATHS:
            got = entry[path]
            bridged = path == "bridge"
            lines.append(
                f"| {label} | {path} | {_ms(got['rtt_ms'])} | {got['stream_msg_per_s']:,.0f} "
                f"| {_cpu(got['cpu_us_per_turn'], bridged)} | {_cpu(got['cpu_us_per_message'], bridged)} |"
            )
    lines += [
        "",
        "Client CPU through the bridge is *driver + bridge process*: both share one core.",
        "",
        "| transport | rtt p50, bridge ÷ direct | rtt p50 added by the bridge | stream rate, bridge ÷ direct "
        "| client CPU per echo turn, bridge ÷ direct | client CPU per streamed message, bridge ÷ direct |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for kind, label in TRANSPORTS.items():
        ratio = results["transports"][kind]["ratio"]
        lines.append(
            f"| {label} | {ratio['rtt_p50']:.2f}× | {ratio['rtt_p50_added_ms']:+.3f} ms | {ratio['stream_rate']:.2f}× "
            f"| {ratio['client_cpu_us_per_turn']:.2f}× | {ratio['client_cpu_us_per_message']:.2f}× |"
        )
    lines += [
        "",
        "Above 1× the bridge path takes longer or costs more, except for the stream rate, where below 1× it is "
        "slower. When other processes keep the cores busy, the wall-clock ratios (rtt, stream rate) move from "
        "run to run; the CPU ratios stay put.",
    ]
    return "\n".join(lines) + "\n"


def write_report(results: dict[str, Any], out: Path) -> None:
    out.write_text(render(results))


def raise_priority(niceness: int) -> int:
    """Set this process's niceness (children inherit it); returns the niceness in effect."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except PermissionError:
        log(f"could not set niceness {niceness} (needs privileges); running at {os.getpriority(os.PRIO_PROCESS, 0)}")
    return os.getpriority(os.PRIO_PROCESS, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one repetition, fewer turns")
    parser.add_argument(
        "--nice",
        type=int,
        default=-10,
        help="niceness of this process, the server and the bridges (default -10, when permitted): other work on "
        "a shared machine then disturbs the measurement less",
    )
    parser.add_argument("--report", action="store_true", help="only re-render the markdown from the json")
    parser.add_argument("--out", default=str(HERE / "bridge.json"), help="results file (default bench/bridge.json)")
    parser.add_argument("--md", default=str(HERE / "BRIDGE.md"), help="report file (default bench/BRIDGE.md)")
    args = parser.parse_args()
    if args.report:
        write_report(json.loads(Path(args.out).read_text()), Path(args.md))
        print(args.md)
        return
    os.sched_setaffinity(0, {LOADGEN_CPU})
    niceness = raise_priority(args.nice)
    os.chdir(ROOT)
    sizes = QUICK if args.quick else FULL
    started = time.monotonic()
    busy_before, own_before = machine_busy_seconds(), own_cpu_seconds()
    log(f"bridge overhead ({'quick' if args.quick else 'full'}): server on CPU {SERVER_CPU}, "
        f"driver and bridge on CPU {LOADGEN_CPU}")  # fmt: skip
    results = asyncio.run(run(sizes))
    wall = time.monotonic() - started
    others = (machine_busy_seconds() - busy_before) - (own_cpu_seconds() - own_before)
    results["meta"] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": args.quick,
        "sizes": sizes,
        "server_cpu": SERVER_CPU,
        "client_cpu": LOADGEN_CPU,
        "niceness": niceness,
        "rtt_block": RTT_BLOCK,
        "machine": machine(),
        "versions": versions(),
        "duration_s": round(wall),
        # CPU used by other processes during the run, as a share of all cores: the machine may be
        # shared, and the absolute figures move with it.
        "other_cpu_share": max(0.0, others) / (wall * (os.cpu_count() or 1)),
    }
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    write_report(results, Path(args.md))
    log(f"done in {results['meta']['duration_s']} s: {args.out}, {args.md}")


if __name__ == "__main__":
    main()
