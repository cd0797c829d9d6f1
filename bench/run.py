"""Run every benchmark and write bench/results.json, bench/RESULTS.md and bench/results.png.

    .venv/bin/python -m bench.run            # the full run (about 12-15 minutes on 2 cores)
    .venv/bin/python -m bench.run --quick    # smaller sizes, one repetition (about 3 minutes)
    .venv/bin/python -m bench.run --servers ours-daphne,ts-sdk --no-fanout

The load generator (this process) runs on CPU 1, every server process on CPU 0 (taskset), so
each side has one core. Every server runs at once; per server and transport a warm-up stream
of 20,000 messages on one connection, then 3 repetitions of stream, rtt and permission on it,
the servers taking turns at each scenario (medians reported); then, per server, the fanout
levels on a freshly started server, sampling the server's RSS. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOADGEN_CPU = int(os.environ.get("BENCH_LOADGEN_CPU", "1"))


def ensure(module: str, package: str) -> None:
    """Install what the benchmark needs into this interpreter's environment (the venv)."""
    try:
        __import__(module)
    except ImportError:
        print(f"installing {package} ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", package], check=True)


ensure("uvloop", "uvloop")
ensure("orjson", "orjson")

import uvloop  # noqa: E402

from bench import scenarios  # noqa: E402
from bench.client import HttpAcp, make_client  # noqa: E402
from bench.servers import LISTENING, SERVERS, Cluster, Proc, RssSampler, Server  # noqa: E402

FULL = {
    "warmup": 20000,
    "stream": 20000,
    "rtt": 2000,
    "permission": 200,
    "reps": 3,
    "fanout": [100, 500, 1000],
    "fanout_prompts": 5,
    "fanout_chunks": 20,
    "calibration": 200000,
}
QUICK = {
    "warmup": 5000,
    "stream": 20000,
    "rtt": 500,
    "permission": 100,
    "reps": 1,
    "fanout": [100, 500],
    "fanout_prompts": 5,
    "fanout_chunks": 20,
    "calibration": 100000,
}

ORDER = ["ours-daphne", "ours-uvicorn", "ours-3w-redis", "ts-sdk", "py-sdk-uvicorn", "py-sdk-daphne"]


def log(*parts: Any) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000

    return {"p50": at(50), "p90": at(90), "p99": at(99), "n": len(ordered)}


def summarize(reps: list[dict[str, float]]) -> dict[str, float]:
    """Median over repetitions of each percentile (ms)."""
    return {key: statistics.median(rep[key] for rep in reps) for key in reps[0]}


# -- environment -------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for name in (
        "django",
        "channels",
        "channels-redis",
        "daphne",
        "twisted",
        "uvicorn",
        "uvloop",
        "httptools",
        "websockets",
        "agent-client-protocol",
        "redis",
        "orjson",
    ):
        try:
            out[name] = version(name)
        except Exception:
            out[name] = "?"
    for label, command in (("node", ["node", "--version"]), ("redis-server", ["redis-server", "--version"])):
        try:
            out[label] = subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            out[label] = "?"
    try:
        package = json.loads(
            (ROOT / "tests/peers/ts_server/node_modules/@agentclientprotocol/sdk/package.json").read_text()
        )
        out["@agentclientprotocol/sdk"] = package["version"]
    except OSError:
        out["@agentclientprotocol/sdk"] = "?"
    try:
        out["acp-channels commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip() + (
            " (dirty)"
            if subprocess.run(
                ["git", "status", "--porcelain", "acp_channels"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip()
            else ""
        )
    except OSError:
        pass
    return out


def machine() -> dict[str, str]:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_kb = int(
            next(
                line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")
            ).split()[1]
        )
    except (OSError, StopIteration):
        mem_kb = 0
    return {
        "nproc": str(os.cpu_count()),
        "cpu": model,
        "memory": f"{mem_kb / 1024 / 1024:.0f} GiB",
        "kernel": platform.release(),
        "os": platform.platform(),
    }


# -- phases --------------------------------------------------------------------------------------


async def calibrate(size: int, reps: int) -> dict[str, list[float]]:
    """The load generator's ceiling against bench.rawserver (a server that only sends)."""
    from bench.client import SSE, AcpClient
    from bench.wire import SseStream, WebSocket

    raw = Proc("rawserver", [sys.executable, "-m", "bench.rawserver"], LISTENING).start()
    out: dict[str, list[float]] = {"http": [], "ws": []}
    try:
        for kind in ("http", "ws"):
            for _ in range(reps + 1):  # the first run warms up
                client = AcpClient("raw")
                check = scenarios.StreamCheck(client, 1, size)
                client.sink = check
                url = f"http://127.0.0.1:{raw.port}/?n={size}"
                started = time.perf_counter()
                if kind == "http":
                    stream: Any = await SseStream.open(url, SSE, client._deliver)
                else:
                    stream = await WebSocket.open(url, client._deliver)
                ended = await asyncio.wait_for(check.done, 60)
                check.check()
                stream.close()
                out[kind].append(size / (ended - started))
            out[kind] = out[kind][1:]
    finally:
        raw.stop()
    return out


def inprocess(mode: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """One `bench.inprocess` run on the server core: its raw samples (a list per repetition)."""
    from bench.servers import SERVER_CPU

    keys = ("warmup", "stream", "rtt", "permission", "reps")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "demo_project.settings"}
    result = subprocess.run(
        [
            "taskset",
            "-c",
            SERVER_CPU,
            sys.executable,
            "-m",
            "bench.inprocess",
            mode,
            "--sizes",
            json.dumps({k: sizes[k] for k in keys}),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode:
        raise RuntimeError(result.stderr[-2000:])
    raw: dict[str, Any] = json.loads(result.stdout)
    return raw


def inprocess_baselines(sizes: dict[str, Any]) -> dict[str, Any]:
    """The SDK agent alone and behind our host, one repetition each in turn (their ratio is a
    README figure: one after the other, a drifting machine made it swing by tens of percent)."""
    modes = ("sdk", "host")
    raw: dict[str, dict[str, list[Any]]] = {mode: {"stream": [], "rtt": [], "permission": []} for mode in modes}
    for _ in range(sizes["reps"]):
        for mode, collected in raw.items():
            one = inprocess(mode, {**sizes, "reps": 1})
            for key, samples in collected.items():
                samples.extend(one[key])
    return {
        mode: {
            "stream": collected["stream"],
            "rtt": summarize([percentiles(s) for s in collected["rtt"]]),
            "permission": summarize([percentiles(s) for s in collected["permission"]]),
        }
        for mode, collected in raw.items()
    }


class Run:
    """One server and transport: its client, open for the whole phase, and what it measured."""

    def __init__(self, key: str, transport: str, factory: Any) -> None:
        self.key, self.transport, self.factory = key, transport, factory
        self.client: Any = None
        self.samples: dict[str, list[Any]] = {"stream": [], "rtt": [], "permission": []}
        self.error: str | None = None

    def fail(self, error: BaseException) -> None:
        self.error = f"{type(error).__name__}: {error}"
        log(f"  {self.key} {self.transport} FAILED", self.error)
        traceback.print_exc()

    def summary(self) -> dict[str, Any]:
        if self.error is not None:
            return {"error": self.error}
        return {
            "stream": self.samples["stream"],
            "rtt": summarize(self.samples["rtt"]),
            "permission": summarize(self.samples["permission"]),
        }


async def scenario_rounds(runs: list[Run], sizes: dict[str, Any]) -> None:
    """Every run's client opens and warms up; then, per repetition and scenario, the runs take
    turns, so each server's figure is taken within seconds of the others' (the speed of a
    shared machine drifts by tens of percent within minutes, which made a whole server's
    turn after another's an unfair comparison)."""
    for run in runs:
        try:
            run.client = run.factory()
            await run.client.open()
            await run.client.new_session()
            await scenarios.run_stream(run.client, sizes["warmup"])
        except Exception as error:
            run.fail(error)
    steps: list[tuple[str, Any]] = [
        ("stream", lambda client: scenarios.run_stream(client, sizes["stream"])),
        ("rtt", lambda client: scenarios.run_rtt(client, sizes["rtt"])),
        ("permission", lambda client: scenarios.run_permission(client, sizes["permission"])),
    ]
    for rep in range(sizes["reps"]):
        for name, step in steps:
            for run in runs:
                if run.error is not None:
                    continue
                try:
                    result = await step(run.client)
                except Exception as error:
                    run.fail(error)
                    continue
                run.samples[name].append(result["msg_per_s"] if name == "stream" else percentiles(result))
        log(f"  round {rep + 1} of {sizes['reps']} done")
    for run in runs:
        if run.error is None and run.client.unexpected:
            run.error = f"ProtocolError: unexpected messages: {run.client.unexpected[:3]}"
        if run.client is not None:
            with contextlib.suppress(Exception):
                await run.client.close()
    for run in runs:
        if run.error is None:
            done = run.summary()
            log(
                f"  {run.key} {run.transport}: stream {statistics.median(done['stream']):,.0f} msg/s, "
                f"rtt p50 {done['rtt']['p50']:.2f} ms p99 {done['rtt']['p99']:.2f} ms, "
                f"permission p50 {done['permission']['p50']:.2f} ms"
            )


async def bench_servers(servers: dict[str, Server], sizes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """stream / rtt / permission over both transports, every server taking turns."""
    runs = [
        Run(key, transport, lambda s=server, t=transport: make_client(t, s.url, **s.client_options))
        for key, server in servers.items()
        for transport in ("http", "ws")
    ]
    await scenario_rounds(runs, sizes)
    return {key: {run.transport: run.summary() for run in runs if run.key == key} for key in servers}


async def cluster_layouts(cluster: Cluster, sizes: dict[str, Any]) -> dict[str, Any]:
    """The cost of the cross-worker hop: all on worker A (same process) against initialize on A,
    SSE on B, POST on C (every POST and every event crosses Redis). HTTP only: a WebSocket is
    always served by the worker that hosts its connection."""
    a, b, c = (cluster.worker_url(i) for i in range(3))
    runs = [Run("same", "http", lambda: HttpAcp(a)), Run("cross", "http", lambda: HttpAcp(a, post_url=c, stream_url=b))]
    await scenario_rounds(runs, sizes)
    return {run.key: run.summary() for run in runs}


async def fanout(key: str, sizes: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for transport in ("http", "ws"):
        server = SERVERS[key]().start()
        levels = []
        try:
            for clients in sizes["fanout"]:
                placed_before = server.placements()
                with RssSampler(server.pids()) as rss:
                    result = await scenarios.run_fanout(
                        transport,
                        server.url,
                        clients,
                        sizes["fanout_prompts"],
                        sizes["fanout_chunks"],
                        options=server.client_options,
                    )
                levels.append(
                    {
                        "clients": clients,
                        "completed": result.completed,
                        "seconds": result.seconds,
                        "peak_rss_mb": rss.peak / 2**20,
                        "errors": result.errors[:5],
                    }
                )
                if (placed := server.placements()) is not None and placed_before is not None:
                    # connections each runner opened at this level (its audit log, read as it comes)
                    levels[-1]["runners"] = [now - then for now, then in zip(placed, placed_before, strict=True)]
                log(
                    f"  {key} fanout {transport} {clients}: {result.completed} completed in {result.seconds:.2f} s, "
                    f"peak RSS {rss.peak / 2**20:.0f} MB {result.errors[:2]}"
                    + (f", per runner {levels[-1]['runners']}" if "runners" in levels[-1] else "")
                )
                await asyncio.sleep(0.5)
        finally:
            server.stop()
            if server.errors():
                out.setdefault("server_errors", []).extend(server.errors()[:5])
        out[transport] = levels
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    sizes = dict(QUICK if args.quick else FULL)
    if args.fanout:
        sizes["fanout"] = [int(n) for n in args.fanout.split(",")]
    results: dict[str, Any] = {
        "meta": {
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "quick": args.quick,
            "sizes": sizes,
            "versions": versions(),
            "machine": machine(),
            "pinning": f"servers on CPU {os.environ.get('BENCH_SERVER_CPU', '0')}, load generator on CPU {LOADGEN_CPU}",
        },
        "servers": {},
    }
    selected = [key for key in SERVERS if key in args.servers.split(",")] if args.servers else ORDER
    if not args.skip_calibration:
        log("calibration: the load generator against a server that only sends")
        results["calibration"] = await calibrate(sizes["calibration"], sizes["reps"])
        log(
            f"  SSE {statistics.median(results['calibration']['http']):,.0f} msg/s, "
            f"WS {statistics.median(results['calibration']['ws']):,.0f} msg/s"
        )
    if not args.skip_inprocess:
        log("in-process: sdk and host, taking turns")
        try:
            results["inprocess"] = inprocess_baselines(sizes)
            for mode, done in results["inprocess"].items():
                log(
                    f"  {mode}: stream {statistics.median(done['stream']):,.0f} msg/s, "
                    f"rtt p50 {done['rtt']['p50']:.3f} ms"
                )
        except Exception as error:
            results["inprocess"] = {mode: {"error": str(error)} for mode in ("sdk", "host")}
            log("  FAILED", error)
    for key in selected:
        results["servers"][key] = {"label": SERVERS[key].label}
    if not args.no_scenarios:
        log(f"servers {', '.join(selected)}: stream / rtt / permission, taking turns")
        servers: dict[str, Server] = {}
        try:
            for key in selected:
                servers[key] = SERVERS[key]().start()
            for key, measured in (await bench_servers(servers, sizes)).items():
                results["servers"][key].update(measured)
            for server in servers.values():
                if isinstance(server, Cluster) and not server.runners:  # the layouts of agents on workers
                    log("cluster layouts: same worker / across workers, taking turns")
                    results["cluster_layout"] = await cluster_layouts(server, sizes)
        finally:
            for key, server in servers.items():
                server.stop()
                results["servers"][key]["server_errors"] = server.errors()[:5]
        Path(args.out).write_text(json.dumps(results, indent=1))
    for key in selected:
        entry = results["servers"][key]
        if not args.no_fanout:
            log(f"server {key}: fanout")
            try:
                entry["fanout"] = await fanout(key, sizes)
            except Exception as error:
                entry["fanout"] = {"error": f"{type(error).__name__}: {error}"}
                log("  fanout FAILED", error)
        Path(args.out).write_text(json.dumps(results, indent=1))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--servers", default="", help=f"comma-separated subset of {','.join(ORDER)}")
    parser.add_argument("--no-fanout", action="store_true")
    parser.add_argument("--no-scenarios", action="store_true", help="only the fanout")
    parser.add_argument("--fanout", default="", help="fanout levels, e.g. 100,300 (default 100,500,1000)")
    parser.add_argument("--skip-calibration", action="store_true")
    parser.add_argument("--skip-inprocess", action="store_true")
    parser.add_argument("--out", default=str(HERE / "results.json"))
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    os.sched_setaffinity(0, {LOADGEN_CPU})
    os.chdir(ROOT)
    started = time.monotonic()
    results = uvloop.run(main_async(args))
    results["meta"]["duration_s"] = round(time.monotonic() - started)
    end_commit = versions().get("acp-channels commit")
    if end_commit != results["meta"]["versions"].get("acp-channels commit"):
        results["meta"]["versions"]["acp-channels commit"] += f" -> {end_commit} during the run"
    Path(args.out).write_text(json.dumps(results, indent=1))
    log(f"done in {results['meta']['duration_s']} s: {args.out}")
    if not args.no_report:
        from bench import report

        report.write(results, HERE)


if __name__ == "__main__":
    main()
