"""The servers under test, each started on loopback and pinned to the server core (taskset).

Every server hosts an agent with the same commands (`stream <n> <bytes>`, `echo <text>`,
`permission`): demo_project.agent for ours and the Python SDK server, the TS peer's agent in
tests/peers/ts_server/server.mjs for the TypeScript SDK server (same chunk format and texts).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Where the servers' code comes from (their cwd and PYTHONPATH): this tree unless
#: BENCH_CODE_ROOT names another checkout (bench/cluster_hop.py --code, a before/after run).
CODE_ROOT = Path(os.environ.get("BENCH_CODE_ROOT") or ROOT)
TS_SERVER = ROOT / "tests" / "peers" / "ts_server"
SERVER_CPU = os.environ.get("BENCH_SERVER_CPU", "0")
MAX_MESSAGE = str(16 * 1024 * 1024 + 4096)
WEBSOCKET_CONNECT_TIMEOUT = "60"
DAPHNE_READY = re.compile(r"Listening on TCP address [\d.]+:(\d+)")
LISTENING = re.compile(r"LISTENING (\d+)")
#: A runner's readiness line (`manage.py acp_runner`, on stderr); its pid stands where a server's
#: port would (Proc.port), since a runner serves no HTTP.
RUNNER_READY = re.compile(r"acp runner \w+ ready \(pid (\d+)\)")
#: The audit line of a connection a runner (or worker) opens.
RUNNER_OPENED = re.compile(r"acp_channels\.audit connection opened ")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Proc:
    """One pinned child process that announces its port on a log line."""

    name: str
    command: list[str]
    ready: re.Pattern[str]
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    process: subprocess.Popen[str] | None = None
    log: list[str] = field(default_factory=list)
    #: Lines that match it are counted in `counted` (every one, past the log's cap).
    count: re.Pattern[str] | None = None
    counted: int = 0

    def start(self, timeout: float = 60.0) -> Proc:
        env = {
            **os.environ,
            "PYTHONPATH": str(CODE_ROOT),
            "DJANGO_SETTINGS_MODULE": "demo_project.settings",
            **self.env,
        }
        self.process = subprocess.Popen(
            ["taskset", "-c", SERVER_CPU, *self.command],
            cwd=CODE_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        ready = threading.Event()
        threading.Thread(target=self._pump, args=(ready,), daemon=True).start()
        if not ready.wait(timeout) or not self.port:
            self.stop()
            raise RuntimeError(f"{self.name} did not start:\n" + "".join(self.log[-40:]))
        return self

    def _pump(self, ready: threading.Event) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            if len(self.log) < 5000:
                self.log.append(line)
            if self.count is not None and self.count.search(line):
                self.counted += 1
            if not self.port and (match := self.ready.search(line)):
                self.port = int(match.group(1))
                ready.set()
        ready.set()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def errors(self) -> list[str]:
        return [line for line in self.log if "Traceback" in line or " 500 " in line]


def daphne(name: str, app: str, env: dict[str, str] | None = None) -> Proc:
    return Proc(
        name,
        # A burst of a thousand upgrades outlives daphne's 5 s handshake timeout on a busy core
        # (403, or the socket closed): docs/several-workers.md.
        [
            sys.executable,
            "-m",
            "daphne",
            "-e",
            "tcp:port=0:interface=127.0.0.1:backlog=2048",
            "--websocket_connect_timeout",
            WEBSOCKET_CONNECT_TIMEOUT,
            "--websocket_timeout",
            "-1",
            "--websocket-max-message-size",
            MAX_MESSAGE,
            "--websocket-max-frame-size",
            MAX_MESSAGE,
            app,
        ],
        DAPHNE_READY,
        {"ACP_SHUTDOWN_GRACE_SECONDS": "1", **(env or {})},
    )


def runner(name: str, env: dict[str, str] | None = None) -> Proc:
    """`manage.py acp_runner` (docs/runners.md): hosts agents, serves no HTTP. A drain of 1 s on
    SIGTERM, as the workers' shutdown grace, so that stopping a server takes no minute. Counts
    the connections it opened (its audit log's lines)."""
    return Proc(
        name,
        [sys.executable, "manage.py", "acp_runner"],
        RUNNER_READY,
        {"ACP_RUNNER_DRAIN_SECONDS": "1", **(env or {})},
        count=RUNNER_OPENED,
    )


def uvicorn(name: str, app: str, env: dict[str, str] | None = None) -> Proc:
    return Proc(name, [sys.executable, "-m", "bench.serve_uvicorn", app], LISTENING, dict(env or {}))


#: The replay window off (docs/resumable-streams.md): event ids stay, nothing is kept once sent.
NO_WINDOW = {"ACP_REPLAY_WINDOW_EVENTS": "0", "ACP_REPLAY_WINDOW_BYTES": "0"}


class Server:
    """What the runner needs: a URL, the pids to sample for memory, start and stop."""

    key = ""
    label = ""
    #: Options for the HTTP client (bench.client.HttpAcp) against this server.
    client_options: dict[str, object] = {}

    def __init__(self) -> None:
        self.procs: list[Proc] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.procs[0].port}/acp"

    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs if proc.process is not None and proc.process.poll() is None]

    def start(self) -> Server:
        for proc in self.procs:
            proc.start()
        return self

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def errors(self) -> list[str]:
        return [line for proc in self.procs for line in proc.errors()]

    def placements(self) -> list[int] | None:
        """Connections each runner opened so far (in order), for a layout with runners."""
        return None


class OursDaphne(Server):
    key, label = "ours-daphne", "ours, daphne"

    def __init__(self) -> None:
        super().__init__()
        self.procs = [daphne("daphne", "demo_project.asgi:application")]


class OursDaphneNoDbSignals(Server):
    """Experiment (not in the default run): see bench/asgi_no_db_signals.py."""

    key, label = "ours-daphne-nodb", "ours, daphne, no db signal receivers (experiment)"

    def __init__(self) -> None:
        super().__init__()
        self.procs = [daphne("daphne", "bench.asgi_no_db_signals:application")]


class OursDaphneLean(Server):
    """Experiment (not in the default run): see bench/asgi_lean.py."""

    key, label = "ours-daphne-lean", "ours, daphne, no middleware, no db signal receivers (experiment)"

    def __init__(self) -> None:
        super().__init__()
        env = {"DJANGO_SETTINGS_MODULE": "bench.settings_lean"}
        self.procs = [daphne("daphne", "bench.asgi_lean:application", env)]


class OursUvicorn(Server):
    key, label = "ours-uvicorn", "ours, uvicorn"

    def __init__(self) -> None:
        super().__init__()
        self.procs = [uvicorn("uvicorn", "demo_project.asgi:application")]


class OursDaphneNoWindow(Server):
    """Experiment (not in the default run): SSE ids on every event, no replay window
    (`python -m bench.resume_cost`)."""

    key, label = "ours-daphne-nowindow", "ours, daphne, ids but no replay window (experiment)"

    def __init__(self) -> None:
        super().__init__()
        self.procs = [daphne("daphne", "demo_project.asgi:application", NO_WINDOW)]


class OursDaphneNoIds(Server):
    """Experiment (not in the default run): see bench/asgi_no_ids.py."""

    key, label = "ours-daphne-noids", "ours, daphne, no SSE ids and no replay window (experiment)"

    def __init__(self) -> None:
        super().__init__()
        self.procs = [daphne("daphne", "bench.asgi_no_ids:application", NO_WINDOW)]


class OursUvicornNoWindow(Server):
    """Experiment (not in the default run): as ours-daphne-nowindow, under uvicorn."""

    key, label = "ours-uvicorn-nowindow", "ours, uvicorn, ids but no replay window (experiment)"

    def __init__(self) -> None:
        super().__init__()
        self.procs = [uvicorn("uvicorn", "demo_project.asgi:application", NO_WINDOW)]


class OursUvicornNoIds(Server):
    """Experiment (not in the default run): as ours-daphne-noids, under uvicorn."""

    key, label = "ours-uvicorn-noids", "ours, uvicorn, no SSE ids and no replay window (experiment)"

    def __init__(self) -> None:
        super().__init__()
        self.procs = [uvicorn("uvicorn", "bench.asgi_no_ids:application", NO_WINDOW)]


class PySdkUvicorn(Server):
    key, label = "py-sdk-uvicorn", "Python SDK, uvicorn"

    def __init__(self) -> None:
        super().__init__()
        self.procs = [uvicorn("py-sdk", "bench.py_sdk_asgi:application")]


class PySdkDaphne(Server):
    key, label = "py-sdk-daphne", "Python SDK, daphne"
    # daphne sends a response head only with the first body bytes, and this app's SSE streams
    # send nothing until an event or the 15 s keep-alive: a client that waits for the head of a
    # stream (as the TS SDK client does for session streams) stalls 15 s. Do not wait for it.
    client_options = {"wait_head": False}

    def __init__(self) -> None:
        super().__init__()
        self.procs = [daphne("py-sdk-daphne", "bench.py_sdk_asgi:application")]


class TsSdk(Server):
    key, label = "ts-sdk", "TS SDK, Node"

    def __init__(self) -> None:
        super().__init__()
        self.procs = [Proc("ts-sdk", ["node", str(TS_SERVER / "server.mjs")], LISTENING)]

    def start(self) -> Server:
        if not (TS_SERVER / "node_modules").is_dir():
            subprocess.run(["npm", "ci", "--silent", "--no-audit", "--no-fund"], cwd=TS_SERVER, check=True)
        return super().start()


class Redis(Proc):
    def __init__(self) -> None:
        port = free_port()
        workdir = tempfile.mkdtemp(prefix="acp-bench-redis-")
        binary = shutil.which("redis-server") or "redis-server"
        super().__init__(
            "redis",
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir],
            re.compile(r"Ready to accept connections"),
        )
        self.redis_port = port

    def _pump(self, ready: threading.Event) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            if len(self.log) < 200:
                self.log.append(line)
            if not self.port and self.ready.search(line):
                self.port = self.redis_port
                ready.set()
        ready.set()


class Cluster(Server):
    """Three daphne workers sharing a private Redis (channels-redis), behind the round-robin
    balancer of tests.cluster in its own process; all pinned to the server core. With `runners`
    (a subclass's), as many `manage.py acp_runner` processes on the same Redis, started before
    the workers; the workers then host no agent (`env` sets AGENT_HOSTS "runners")."""

    key, label = "ours-3w-redis", "ours, 3 daphne workers + Redis"
    app = "demo_project.asgi:application"
    env: dict[str, str] = {}
    runners = 0

    def __init__(self, size: int = 3) -> None:
        super().__init__()
        self.size = size
        self.redis = Redis()
        self.workers: list[Proc] = []
        self.runner_procs: list[Proc] = []
        self.balancer: Proc | None = None

    def start(self) -> Server:
        self.redis.start()
        self.procs = [self.redis]
        env = {
            "REDIS_URL": f"redis://127.0.0.1:{self.redis.redis_port}/0",
            "ACP_REDIS_PREFIX": f"acp-bench-{uuid.uuid4().hex[:8]}:",
            **self.env,
        }
        try:
            # A runner announces itself once it takes placements: a worker started after that
            # finds it in Redis at its first initialize.
            self.runner_procs = [runner(f"runner{i}", env).start() for i in range(self.runners)]
            self.workers = [daphne(f"worker{i}", self.app, env) for i in range(self.size)]
            for worker in self.workers:
                worker.start()
            self.balancer = Proc(
                "balancer", [sys.executable, "-m", "bench.balancer", *(str(w.port) for w in self.workers)], LISTENING
            ).start()
        except BaseException:
            self.procs = [*self.workers, *self.runner_procs, self.redis]
            self.stop()
            raise
        self.procs = [self.balancer, *self.workers, *self.runner_procs, self.redis]
        return self

    def stop(self) -> None:
        # Front to back: the balancer, the workers, the runners (which drain through Redis), Redis last.
        for proc in self.procs:
            proc.stop()

    def placements(self) -> list[int] | None:
        return [proc.counted for proc in self.runner_procs] if self.runners else None

    def worker_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.workers[index].port}/acp"


class ClusterPatient(Cluster):
    """Experiment (not in the default run): WORKER_TIMEOUT_SECONDS 10 instead of 1.5, to tell
    a worker that is slow to acknowledge under load from a dead one."""

    key, label = "ours-3w-redis-patient", "ours, 3 workers + Redis, WORKER_TIMEOUT_SECONDS 10 (experiment)"
    env = {"ACP_WORKER_TIMEOUT_SECONDS": "10"}


class ClusterRunners(Cluster):
    """Three web workers that host no agent (AGENT_HOSTS "runners") and two runners, on one
    private Redis behind the same balancer (docs/runners.md). Each runner may host every client
    of bench.run's largest fanout (MAX_CONNECTIONS 2,000 rather than the default 1,000): the
    placement balances by the loads runners publish every 0.5 s, so a burst may land unevenly."""

    key, label = "ours-3w-2r-redis", "ours, 3 web workers + 2 runners + Redis"
    env = {"ACP_AGENT_HOSTS": "runners", "ACP_MAX_CONNECTIONS": "2000"}
    runners = 2


class ClusterWsNoLayer(Cluster):
    """Experiment (not in the default run): see bench/asgi_ws_no_layer.py."""

    key, label = "ours-3w-redis-wsfix", "ours, 3 workers + Redis, WebSocket consumer without layer (experiment)"
    app = "bench.asgi_ws_no_layer:application"


SERVERS: dict[str, type[Server]] = {
    cls.key: cls
    for cls in (
        OursDaphne,
        OursUvicorn,
        Cluster,
        ClusterRunners,
        TsSdk,
        PySdkUvicorn,
        PySdkDaphne,
        OursDaphneNoDbSignals,
        OursDaphneLean,
        ClusterPatient,
        ClusterWsNoLayer,
        OursDaphneNoWindow,
        OursDaphneNoIds,
        OursUvicornNoWindow,
        OursUvicornNoIds,
    )
}


def rss_bytes(pids: list[int]) -> int:
    """Resident memory of these processes and their children, now."""
    total = 0
    seen: set[int] = set()
    stack = list(pids)
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
            with open(f"/proc/{pid}/task/{pid}/children") as children:
                stack.extend(int(child) for child in children.read().split())
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return total


class RssSampler:
    """Samples the servers' summed RSS every 50 ms in a thread; `peak` is the highest seen."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak = rss_bytes(pids)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes(self.pids))

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_bytes(self.pids))


def wait_port_closed(port: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        except OSError:
            return
        time.sleep(0.05)
