"""Profile a server (py-spy, sampling the server process) while one scenario runs against it.

    .venv/bin/python -m bench.profile ours-daphne stream http       # 5 x 20,000 messages
    .venv/bin/python -m bench.profile ours-uvicorn rtt ws
    .venv/bin/python -m bench.profile ours-daphne fanout http --clients 500
    .venv/bin/python -m bench.profile ours-3w-redis rtt http --worker 0   # the host's worker
    .venv/bin/python -m bench.profile ours-3w-2r-redis rtt http --layout same --runner 0   # a runner

Writes bench/profiles/<server>-<scenario>-<transport>.txt (shares of on-CPU samples by
function, inclusive and self, and by package) and the raw collapsed stacks (.collapsed, for
flamegraph tools or speedscope). Installs py-spy into the venv if it is missing.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from bench import scenarios
from bench.client import make_client
from bench.run import LOADGEN_CPU, ensure
from bench.servers import SERVERS, Cluster, Server

HERE = Path(__file__).resolve().parent
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^:()]+)(?::\d+)?\)$")

PACKAGES = [
    ("acp_channels/", "acp_channels"),
    ("demo_project/", "demo agent"),
    ("/acp/", "acp SDK (agent side)"),
    ("/pydantic/", "pydantic"),
    ("/pydantic_core/", "pydantic"),
    ("/corsheaders/", "django-cors-headers"),
    ("/django/", "django"),
    ("/channels_redis/", "channels_redis"),
    ("/channels/", "channels"),
    ("/asgiref/", "asgiref"),
    ("/daphne/", "daphne"),
    ("/twisted/", "twisted"),
    ("/autobahn/", "autobahn"),
    ("/uvicorn/", "uvicorn"),
    ("/websockets/", "websockets"),
    ("/redis/", "redis-py"),
    ("/msgpack/", "msgpack"),
    ("/asyncio/", "asyncio"),
    ("/json/", "json"),
    ("/logging/", "logging"),
]


def package_of(file: str) -> str:
    path = "/" + file
    for needle, name in PACKAGES:
        if ("/" + needle.strip("/") + ("/" if needle.endswith("/") else "")) in path:
            return name
    return "other"


def short(frame: str) -> str:
    match = FRAME.match(frame)
    if not match:
        return frame
    file = match["file"]
    for marker in ("site-packages/", "python3.11/", "/work/main/"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    return f"{match['function']} ({file})"


def analyse(collapsed: str, top: int = 30) -> str:
    inclusive: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [frame for frame in stack.split(";") if FRAME.match(frame)]
        if not frames:
            continue
        total += count
        for frame in set(map(short, frames)):
            inclusive[frame] += count
        leaf = frames[-1]
        self_time[short(leaf)] += count
        leaf_match = FRAME.match(leaf)
        packages[package_of(leaf_match["file"] if leaf_match else leaf)] += count
    if not total:
        return "no samples\n"
    lines = [f"{total} on-CPU samples (idle excluded)", "", "self time by package:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in packages.most_common()]
    lines += ["", f"top {top} by inclusive time:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in inclusive.most_common(top)]
    lines += ["", f"top {top} by self time:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in self_time.most_common(top)]
    ours = [(name, n) for name, n in inclusive.most_common() if "acp_channels/" in name]
    lines += ["", "acp_channels functions by inclusive time:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in ours[:top]]
    return "\n".join(lines) + "\n"


async def drive(
    server: Server, scenario: str, transport: str, args: argparse.Namespace, record: Callable[[], None]
) -> None:
    url = server.url
    if isinstance(server, Cluster) and args.layout == "cross":
        from bench.client import HttpAcp

        a, b, c = (server.worker_url(i) for i in range(3))
        factory = lambda: HttpAcp(a, post_url=c, stream_url=b)  # noqa: E731
    elif isinstance(server, Cluster) and args.layout == "same":
        from bench.client import HttpAcp

        factory = lambda: HttpAcp(server.worker_url(0))  # noqa: E731
    else:
        factory = lambda: make_client(transport, url, **server.client_options)  # noqa: E731
    if scenario == "fanout":
        await scenarios.run_fanout(transport, url, 20, options=server.client_options)  # warm-up
        record()
        result = await scenarios.run_fanout(transport, url, args.clients, options=server.client_options)
        print(f"fanout {args.clients}: {result.completed} completed in {result.seconds:.2f} s {result.errors[:3]}")
        return
    client = factory()
    await client.open()
    await client.new_session()
    await scenarios.run_stream(client, 20000)  # warm-up
    await scenarios.run_rtt(client, 200)
    await scenarios.run_permission(client, 20)
    record()
    for _ in range(args.repeat):
        if scenario == "stream":
            result = await scenarios.run_stream(client, 20000)
            print(f"stream: {result['msg_per_s']:,.0f} msg/s")
        elif scenario == "rtt":
            samples = sorted(await scenarios.run_rtt(client, 2000))
            print(f"rtt p50 {samples[len(samples) // 2] * 1000:.2f} ms")
        else:
            samples = sorted(await scenarios.run_permission(client, 200))
            print(f"permission p50 {samples[len(samples) // 2] * 1000:.2f} ms")
    await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("server", choices=sorted(SERVERS))
    parser.add_argument("scenario", choices=["stream", "rtt", "permission", "fanout"])
    parser.add_argument("transport", choices=["http", "ws"])
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--worker", type=int, default=0, help="cluster: which worker process to sample")
    parser.add_argument("--runner", type=int, help="cluster with runners: sample this runner instead of a worker")
    parser.add_argument("--layout", choices=["balanced", "same", "cross"], default="balanced")
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument(
        "--gil",
        action="store_true",
        help="only samples holding the GIL: Python's own CPU (a process preempted inside a socket "
        "write, as on a core shared with Redis, otherwise counts as on CPU)",
    )
    args = parser.parse_args()
    ensure("uvloop", "uvloop")
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "py-spy"], check=True)
    os.sched_setaffinity(0, {LOADGEN_CPU})
    server = SERVERS[args.server]().start()
    target = server.workers[args.worker] if isinstance(server, Cluster) else server.procs[0]
    name = f"{args.server}-{args.scenario}-{args.transport}" + (f"-{args.layout}" if args.layout != "balanced" else "")
    if isinstance(server, Cluster) and args.runner is not None:
        target = server.runner_procs[args.runner]
        name += f"-runner{args.runner}"
    elif isinstance(server, Cluster):
        name += f"-worker{args.worker}"
    out = HERE / "profiles"
    out.mkdir(exist_ok=True)
    collapsed = out / f"{name}.collapsed"
    recorders: list[subprocess.Popen[bytes]] = []

    def record() -> None:
        recorders.append(
            subprocess.Popen(
                [
                    "taskset",
                    "-c",
                    str(LOADGEN_CPU),
                    str(spy),
                    "record",
                    "--pid",
                    str(target.pid),
                    "--rate",
                    str(args.rate),
                    "--format",
                    "raw",
                    "--nonblocking",
                    *(["--gil"] if args.gil else []),
                    "--output",
                    str(collapsed),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        time.sleep(0.5)  # py-spy attaches

    try:
        import uvloop

        uvloop.run(drive(server, args.scenario, args.transport, args, record))
    finally:
        for recorder in recorders:
            recorder.send_signal(signal.SIGINT)
            recorder.wait(30)
        server.stop()
    report = analyse(collapsed.read_text() if collapsed.exists() else "")
    (out / f"{name}.txt").write_text(f"py-spy {args.rate} Hz on {args.server} pid {target.pid}, {name}\n\n{report}")
    print(report)


if __name__ == "__main__":
    main()
