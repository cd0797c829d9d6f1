"""Several daphne workers behind a round-robin TCP balancer, sharing a real Redis.

`RedisServer` is the machine's Redis on 127.0.0.1:6379 when it answers, or a private
`redis-server` on a free port (always private when a test needs to stop it). `Balancer` sends
each new TCP connection to the next worker, like a plain load balancer without sticky sessions.
`Cluster` has the same `url`/`ws_url`/`errors()` surface as a single `DaphneServer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import socket
import subprocess
import tempfile
import threading
import urllib.request
import uuid
from dataclasses import dataclass, field

from tests.live import DaphneServer, RunnerProcess


def _redis_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisServer:
    port: int = 6379
    process: subprocess.Popen[bytes] | None = None
    #: More redis-server options (`("--requirepass", "secret")`).
    options: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def shared_or_private(cls) -> RedisServer:
        return cls() if _redis_answers(6379) else cls.private()

    @classmethod
    def private(cls, *options: str) -> RedisServer:
        server = cls(port=_free_port(), options=options)
        server.start()
        return server

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
        workdir = tempfile.mkdtemp(prefix="acp-redis-")
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                workdir,
                *self.options,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert self.process.stdout is not None
        for line in self.process.stdout:  # wait for its own readiness line
            if b"Ready to accept connections" in line:
                threading.Thread(target=self.process.stdout.read, daemon=True).start()
                return
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


class Balancer:
    """A round-robin TCP proxy on loopback, running its own event loop in a thread."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self._next = itertools.count()  # modulo the rotation's length now: ports may change
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Balancer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        # A real balancer's listen queue: a burst of clients must not overflow it (SYN retries).
        server = asyncio.start_server(self._accept, "127.0.0.1", 0, backlog=4096)
        self._server = self._loop.run_until_complete(server)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        port = self.ports[next(self._next) % len(self.ports)]
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            client_writer.close()  # that worker is down: the client sees a reset, as with a real balancer
            return
        await asyncio.gather(self._pipe(client_reader, upstream_writer), self._pipe(upstream_reader, client_writer))

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def stop(self) -> None:
        def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(shutdown)
        self._thread.join(10)


#: The clusters started in this process since the current test's setup, and those still running
#: from before, for the logs a failing test's report shows (tests/conftest.py); a stopped
#: cluster's servers keep their logs.
STARTED: list[Cluster] = []


def _running(cluster: Cluster) -> bool:
    return any(worker.process is not None and worker.process.poll() is None for worker in cluster.workers)


def forget_stopped_clusters() -> int:
    """Before a test: keep only the clusters still running (a module's); returns how many."""
    STARTED[:] = [cluster for cluster in STARTED if _running(cluster)]
    return len(STARTED)


def logs_of_started_clusters(since: int, lines: int = 150) -> str:
    """The last `lines` log lines of each cluster started at or after index `since` of STARTED,
    or still running from before (a module's cluster)."""
    parts = []
    for index, cluster in enumerate(STARTED):
        if index >= since or _running(cluster):
            heading = f"-- cluster {index} ({len(cluster.log)} lines, the last {lines}) --\n"
            parts.append(heading + "".join(cluster.log[-lines:]))
    return "\n".join(parts)


@dataclass
class Cluster:
    redis: RedisServer
    size: int = 3
    env: dict[str, str] = field(default_factory=dict)
    workers: list[DaphneServer] = field(default_factory=list)
    #: With runners (AGENT_HOSTS "runners"): this many `manage.py acp_runner` processes host the
    #: agents, the workers none.
    runner_count: int = 0
    runners: list[RunnerProcess] = field(default_factory=list)
    balancer: Balancer | None = None
    #: Every worker's log lines, in arrival order (one list shared by all workers).
    log: list[str] = field(default_factory=list)

    def start(self) -> Cluster:
        STARTED.append(self)
        env = {"REDIS_URL": self.redis.url, "ACP_REDIS_PREFIX": f"acp-test-{uuid.uuid4().hex[:8]}:", **self.env}
        if self.runner_count:
            env["ACP_AGENT_HOSTS"] = "runners"
        self.env = env
        for _ in range(self.runner_count):
            self.add_runner()
        self.workers = [DaphneServer(env=dict(env), log=self.log).spawn() for _ in range(self.size)]
        for worker in self.workers:
            worker.wait_listening()
            # What a balancer's readiness probe does first: the worker joins the cluster (its
            # inbox and heartbeat start with its first request, and until then no other worker
            # or admin command sees it). Its answer may be 503 (a test with Redis down).
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{worker.port}/ready", timeout=10).close()
        self.balancer = Balancer([worker.port for worker in self.workers]).start()
        return self

    def replace_worker(self, index: int) -> DaphneServer:
        """A rolling restart of one web worker, as a balancer with health checks does it: out of
        the rotation, SIGTERM (it drains), a new worker with the same settings, back in."""
        assert self.balancer is not None
        old = self.workers[index]
        others = [worker.port for worker in self.workers if worker is not old]
        self.balancer.ports[:] = others
        old.stop()
        new = DaphneServer(env=dict(old.env), log=self.log).start()
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{new.port}/ready", timeout=10).close()
        self.workers[index] = new
        self.balancer.ports[:] = [worker.port for worker in self.workers]
        return new

    def add_runner(self, **env: str) -> RunnerProcess:
        """Start one more runner of this cluster (started: it announced itself)."""
        runner = RunnerProcess(env={**self.env, **env}, log=self.log).start()
        self.runners.append(runner)
        return runner

    @property
    def port(self) -> int:
        assert self.balancer is not None
        return self.balancer.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/acp"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/acp"

    def errors(self) -> list[str]:
        return DaphneServer(log=self.log).errors()

    def stop(self) -> None:
        if self.balancer is not None:
            self.balancer.stop()
        servers = [*self.workers, *self.runners]
        for server in servers:
            server.terminate()  # all draining at once
        for server in servers:
            server.stop()
