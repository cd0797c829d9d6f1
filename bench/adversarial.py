"""Hostile and slow clients against a real daphne serving the demo agent: what they cost the server.

    .venv/bin/python -m bench.adversarial                                  # this checkout
    .venv/bin/python -m bench.adversarial --server-root /work/wt/before \\
        --out bench/adversarial-before.json                                # another checkout
    .venv/bin/python -m bench.adversarial --render bench/adversarial-before.json bench/adversarial.json

Each scenario starts a fresh `daphne demo_project.asgi:application` from `--server-root` (its
code, its demo settings) pinned to CPU 0; this process (the clients) runs on CPU 1. The
server's RSS (with its children) is sampled every 50 ms from /proc; growth is measured against
the RSS after one warm-up connection (initialize, session/new, a prompt, DELETE). Scenarios:

  a. one SSE client that never reads its session stream (SO_RCVBUF 4 KiB, raw socket) while
     the agent streams `stream 400000 1024` to it; until RSS is flat for 3 s (or the window
     ends), then the client closes; RSS once it left;
  b. the same over WebSocket (the client reads until session/new is answered, then never);
  c. a 1 GiB POST body, with Content-Length declared and chunked: status, when, peak RSS;
  d. a batch of 200,000 tiny requests (`authenticate`) in one POST, with the default batch
     limit and with ACP_MAX_BATCH_ENTRIES=200000: time from POST to the grouped reply (or the
     error), peak RSS, and another client's initialize latency meanwhile;
  e. 2,000 GETs with made-up Acp-Session-Id values (each opened and closed), then RSS growth;
  f. initialize in a loop for 10 s without DELETE (abandoned connections).

Results go to a JSON file (`--out`, default bench/adversarial.json) and bench/ADVERSARIAL.md is
rendered from the results files (`render()`): one column per run. See bench/README.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import functools
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import rawhttp
from tests.rawhttp import Closed, RawResponse, SseStream, WsReader

from bench.run import machine
from bench.servers import DAPHNE_READY, MAX_MESSAGE, SERVER_CPU, Proc, rss_bytes

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
QUIET_AGENT_PATH = HERE / "quiet_agent"
LOADGEN_CPU = int(os.environ.get("BENCH_LOADGEN_CPU", "1"))
MIB = 1 << 20
GIB = 1 << 30

STREAM_PROMPT = "stream 400000 1024"
SLOW_RCVBUF = 4096
BATCH_ENTRIES = 200_000
MADE_UP_SESSIONS = 2000
ABANDON_SECONDS = 10.0
#: The defaults; --window changes how long a non-reading client is watched at most.
SETTINGS = {
    "window_s": 60.0,
    "flat_s": 3.0,
    "flat_tolerance_mb": 1.0,
    "after_flat_s": 2.0,
    "after_max_s": 20.0,
    "body_timeout_s": 60.0,
    "batch_timeout_s": 60.0,
    "probe_interval_s": 0.25,
    "scenario_timeout_s": 120.0,
    "rss_cap_mb": 8192.0,
    "min_available_mb": 2048.0,
}


def log(*parts: Any) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


def mb(size: float) -> float:
    return round(size / MIB, 1)


# -- the server ----------------------------------------------------------------------------------


@dataclass
class RootedDaphne(Proc):
    """bench.servers' pinned daphne, run from another checkout (its cwd and PYTHONPATH; then
    bench/quiet_agent of this checkout, for `bench_quiet_agent`, a module name no checkout has)."""

    root: Path = ROOT

    def start(self, timeout: float = 60.0) -> RootedDaphne:
        path = os.pathsep.join((str(self.root), str(QUIET_AGENT_PATH)))
        env = {**os.environ, "PYTHONPATH": path, "DJANGO_SETTINGS_MODULE": "demo_project.settings", **self.env}
        self.process = subprocess.Popen(
            ["taskset", "-c", SERVER_CPU, *self.command],
            cwd=self.root,
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
            raise RuntimeError("daphne did not start:\n" + "".join(self.log[-40:]))
        return self


def start_server(root: Path, env: dict[str, str] | None = None) -> RootedDaphne:
    command = [
        sys.executable,
        "-m",
        "daphne",
        "-e",
        "tcp:port=0:interface=127.0.0.1:backlog=2048",
        "--websocket_timeout",
        "-1",
        "--websocket-max-message-size",
        MAX_MESSAGE,
        "--websocket-max-frame-size",
        MAX_MESSAGE,
        "demo_project.asgi:application",
    ]
    server = RootedDaphne(
        "daphne", command, DAPHNE_READY, {"ACP_SHUTDOWN_GRACE_SECONDS": "1", **(env or {})}, root=root
    )
    return server.start()


class RssTrace:
    """The server's RSS every 50 ms in a thread, kept as (monotonic time, bytes). The safety stop:
    when the server's RSS passes SETTINGS["rss_cap_mb"] or the machine's MemAvailable falls under
    SETTINGS["min_available_mb"], the server is killed at once (SIGKILL) and `stopped` says why."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, int]] = [(time.monotonic(), rss_bytes([pid]))]
        self.stopped = ""
        self.stopped_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            rss = rss_bytes([self.pid])
            self.samples.append((time.monotonic(), rss))
            if not self.stopped:
                self._check(rss)

    def _check(self, rss: int) -> None:
        available = mem_available()
        if rss > SETTINGS["rss_cap_mb"] * MIB:
            reason = f"stopped at cap: server RSS {mb(rss):,.0f} MiB > {SETTINGS['rss_cap_mb']:g} MiB"
        elif available is not None and available < SETTINGS["min_available_mb"] * MIB:
            reason = (
                f"stopped at cap: MemAvailable {mb(available):,.0f} MiB < "
                f"{SETTINGS['min_available_mb']:g} MiB (server RSS {mb(rss):,.0f} MiB)"
            )
        else:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.stopped_at = time.monotonic()
        self.stopped = reason
        log("  ", reason, "- server killed")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def now(self) -> int:
        return rss_bytes([self.pid])

    def peak(self, since: float = 0.0) -> int:
        return max((rss for at, rss in self.samples if at >= since), default=self.now())

    def wait_flat(self, flat_s: float, max_s: float, tolerance: float = SETTINGS["flat_tolerance_mb"] * MIB) -> bool:
        """Until RSS stayed within `tolerance` for `flat_s` (True) or `max_s` passed or the server
        was stopped at the cap (False)."""
        started = time.monotonic()
        while time.monotonic() - started < max_s and not self.stopped:
            time.sleep(0.25)  # polling the samples: RSS has no event to wait for
            now = time.monotonic()
            if now - started < flat_s:
                continue
            recent = [rss for at, rss in self.samples if at >= now - flat_s]
            if recent and max(recent) - min(recent) <= tolerance:
                return True
        return False


def mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


# -- client steps -----------------------------------------------------------------------------------


def request(request_id: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def prompt(request_id: int, session_id: str, text: str) -> dict[str, Any]:
    return request(request_id, "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]})


def accepted(response: RawResponse | Closed, what: str) -> None:
    if not isinstance(response, RawResponse) or response.status != 202:
        raise RuntimeError(f"{what}: {response}")


def open_session(port: int) -> tuple[str, SseStream, str]:
    """initialize, the connection stream, session/new: (connection id, that stream, session id)."""
    connection_id = rawhttp.initialize(port)
    stream = SseStream.open(port, connection_id)
    accepted(
        rawhttp.post_json(port, request(1, "session/new", {"cwd": "/tmp", "mcpServers": []}), connection_id),
        "session/new",
    )
    reply = stream.until_reply(1)
    return connection_id, stream, reply["result"]["sessionId"]


def warm_up(port: int) -> None:
    """One whole connection, so lazily imported code is in the baseline."""
    connection_id, stream, session_id = open_session(port)
    session = SseStream.open(port, connection_id, session_id)
    accepted(rawhttp.post_json(port, prompt(2, session_id, "echo warm"), connection_id, session_id), "prompt")
    session.until_reply(2)
    session.close()
    stream.close()
    rawhttp.delete(port, connection_id)


def response_summary(response: RawResponse | Closed) -> str:
    if isinstance(response, Closed):
        return "closed (reset)" if response.reset else "closed"
    return f"{response.status} {response.body[:80].decode('utf-8', 'replace')}".strip()


# -- scenarios ------------------------------------------------------------------------------------


@dataclass
class Context:
    server: RootedDaphne
    trace: RssTrace
    baseline: int
    out: dict[str, Any] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return self.server.port

    def growth(self, rss: int) -> float:
        return mb(rss - self.baseline)


def watch_non_reader(ctx: Context, close_client: Callable[[], None]) -> None:
    """Shared by a and b: watch while the client does not read, close it, watch again."""
    started = time.monotonic()
    flat = ctx.trace.wait_flat(SETTINGS["flat_s"], SETTINGS["window_s"])
    ctx.out["watched_s"] = round(time.monotonic() - started, 1)
    ctx.out["ended_by"] = "flat" if flat else "cap" if ctx.trace.stopped else "window"
    ctx.out["peak_growth_mb"] = ctx.growth(ctx.trace.peak(started))
    if ctx.trace.stopped:
        close_client()
        return
    ctx.out["growth_at_close_mb"] = ctx.growth(ctx.trace.now())
    close_client()
    left = time.monotonic()
    ctx.trace.wait_flat(SETTINGS["after_flat_s"], SETTINGS["after_max_s"])
    ctx.out["growth_after_client_left_mb"] = ctx.growth(ctx.trace.now())
    ctx.out["peak_growth_whole_mb"] = ctx.growth(ctx.trace.peak(started))
    ctx.out["settle_after_left_s"] = round(time.monotonic() - left, 1)


def sse_no_read(ctx: Context) -> None:
    connection_id, stream, session_id = open_session(ctx.port)
    slow = rawhttp.connect(ctx.port, rcvbuf=SLOW_RCVBUF)
    slow.sendall(rawhttp.stream_request(connection_id, session_id))
    accepted(rawhttp.post_json(ctx.port, prompt(2, session_id, STREAM_PROMPT), connection_id, session_id), "prompt")
    try:
        watch_non_reader(ctx, slow.close)
    finally:
        slow.close()
        stream.close()


def ws_no_read(ctx: Context) -> None:
    sock, answer = rawhttp.ws_handshake(ctx.port, rcvbuf=SLOW_RCVBUF)
    try:
        if not isinstance(answer, RawResponse) or answer.status != 101:
            raise RuntimeError(f"upgrade: {answer}")
        frames = WsReader(sock, answer.body)

        def send(message: dict[str, Any]) -> None:
            sock.sendall(rawhttp.ws_frame(rawhttp.TEXT, json.dumps(message).encode()))

        send(request(0, "initialize", {"protocolVersion": 1}))
        frames.json_until(0)
        send(request(1, "session/new", {"cwd": "/tmp", "mcpServers": []}))
        session_id = frames.json_until(1)["result"]["sessionId"]
        send(prompt(2, session_id, STREAM_PROMPT))
        watch_non_reader(ctx, sock.close)
    finally:
        sock.close()


def big_body(ctx: Context, chunked: bool) -> None:
    """POST 1 GiB to a live connection, reading whatever the server answers while sending."""
    connection_id = rawhttp.initialize(ctx.port)
    headers = [("Content-Type", "application/json"), ("Acp-Connection-Id", connection_id), ("Connection", "close")]
    headers.append(("Transfer-Encoding", "chunked") if chunked else ("Content-Length", str(GIB)))
    block = b" " * MIB
    piece = (b"100000\r\n" + block + b"\r\n") if chunked else block
    pieces = GIB // MIB
    sock = rawhttp.connect(ctx.port)
    sock.sendall(rawhttp.request_bytes("POST", "/acp", headers))
    sock.setblocking(False)
    started = time.monotonic()
    deadline = started + SETTINGS["body_timeout_s"]
    sent = 0  # body bytes on the wire (with chunk framing when chunked)
    pending = memoryview(piece)
    sent_pieces = 0
    answer: RawResponse | Closed | None = None
    outcome = ""
    try:
        while answer is None and time.monotonic() < deadline:
            want_write = sent_pieces < pieces or (chunked and sent_pieces == pieces)
            readable, writable, _ = select.select([sock], [sock] if want_write else [], [], 0.5)
            if readable:
                sock.setblocking(True)
                answer = rawhttp.read_response(sock, 10.0)
                break
            if writable:
                try:
                    count = sock.send(pending)
                except (BrokenPipeError, ConnectionResetError) as error:
                    outcome = f"send failed: {type(error).__name__}"
                    sock.setblocking(True)
                    with contextlib.suppress(rawhttp.Hang, OSError):
                        answer = rawhttp.read_response(sock, 5.0)
                    break
                sent += count
                pending = pending[count:]
                if not pending:
                    sent_pieces += 1
                    if sent_pieces < pieces:
                        pending = memoryview(piece)
                    elif chunked and sent_pieces == pieces:
                        pending = memoryview(b"0\r\n\r\n")
                    elif chunked:
                        sent_pieces = pieces + 1
        else:
            outcome = outcome or "no answer before the deadline"
    finally:
        sock.close()
    ctx.out["answer"] = response_summary(answer) if answer is not None else outcome
    ctx.out["answered_after_s"] = round(time.monotonic() - started, 2)
    ctx.out["sent_before_answer_mb"] = mb(sent)
    ctx.out["whole_body_sent"] = sent_pieces >= pieces
    if outcome and answer is not None:
        ctx.out["note"] = outcome
    ctx.out["peak_growth_mb"] = ctx.growth(ctx.trace.peak())
    ctx.trace.wait_flat(SETTINGS["after_flat_s"], SETTINGS["after_max_s"])
    ctx.out["growth_after_mb"] = ctx.growth(ctx.trace.now())


def body_content_length(ctx: Context) -> None:
    big_body(ctx, chunked=False)


def body_chunked(ctx: Context) -> None:
    big_body(ctx, chunked=True)


class InitializeProbe:
    """Another client: starts an initialize (then DELETE) every probe interval, each on its own
    thread, so a server that blocks still gets one probe per interval; times each initialize."""

    def __init__(self, port: int, limit: int = 100) -> None:
        self.port = port
        self.limit = limit
        self.samples: list[tuple[float, float | str]] = []  # (started, seconds or an error)
        self.finished: dict[float, float] = {}  # started -> when it returned
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._scheduler = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> float | str:
        started = time.perf_counter()
        try:
            connection_id = rawhttp.initialize(self.port, timeout=SETTINGS["batch_timeout_s"])
        except (AssertionError, OSError, rawhttp.Hang) as error:
            return f"{type(error).__name__}: {str(error)[:80]}"
        took = time.perf_counter() - started
        with contextlib.suppress(OSError, rawhttp.Hang):
            rawhttp.delete(self.port, connection_id)
        return took

    def start(self) -> InitializeProbe:
        self._scheduler.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set() and len(self._threads) < self.limit:
            thread = threading.Thread(target=self._one, args=(time.monotonic(),), daemon=True)
            thread.start()
            self._threads.append(thread)
            self._stop.wait(SETTINGS["probe_interval_s"])

    def _one(self, started: float) -> None:
        value = self.sample()
        self.finished[started] = time.monotonic()
        self.samples.append((started, value))

    def stop(self) -> None:
        """No new probe; wait for the ones under way."""
        self._stop.set()
        self._scheduler.join()
        deadline = time.monotonic() + SETTINGS["batch_timeout_s"]
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0))


def latency_summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "median_ms": round(statistics.median(values) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
    }


def batch(ctx: Context) -> None:
    connection_id = rawhttp.initialize(ctx.port)
    stream = SseStream.open(ctx.port, connection_id, timeout=SETTINGS["batch_timeout_s"])
    idle = InitializeProbe(ctx.port)
    ctx.out["initialize_idle"] = latency_summary([s for s in (idle.sample() for _ in range(5)) if isinstance(s, float)])
    body = (
        b"["
        + b",".join(
            b'{"jsonrpc":"2.0","id":%d,"method":"authenticate","params":{"methodId":"x"}}' % i
            for i in range(BATCH_ENTRIES)
        )
        + b"]"
    )
    ctx.out["body_mb"] = mb(len(body))
    started = time.monotonic()
    probe = InitializeProbe(ctx.port).start()
    try:
        answer = rawhttp.post_json(ctx.port, body, connection_id, timeout=SETTINGS["batch_timeout_s"])
        ctx.out["post_answer"] = response_summary(answer)
        ctx.out["post_answered_after_s"] = round(time.monotonic() - started, 2)
        if isinstance(answer, RawResponse) and answer.status == 202:
            reply = next(stream.events(SETTINGS["batch_timeout_s"]), None)
            if isinstance(reply, list):
                errors = sum(1 for entry in reply if isinstance(entry, dict) and "error" in entry)
                ctx.out["reply"] = f"array of {len(reply)} ({errors} errors)"
            elif isinstance(reply, dict) and "error" in reply:
                ctx.out["reply"] = f"error {reply['error'].get('code')}: {str(reply['error'].get('message'))[:60]}"
            else:
                ctx.out["reply"] = str(reply)[:80]
        ctx.out["processing_s"] = round(time.monotonic() - started, 2)
    except rawhttp.Hang as error:
        ctx.out["processing_s"] = None
        ctx.out["reply"] = f"no reply within {SETTINGS['batch_timeout_s']:g} s ({str(error)[:60]})"
    finally:
        ended = time.monotonic()
        probe.stop()
        stream.close()
    during = [value for at, value in probe.samples if started <= at <= ended]
    ctx.out["initialize_during"] = latency_summary([v for v in during if isinstance(v, float)])
    failures = [v for v in during if isinstance(v, str)]
    if failures:
        ctx.out["initialize_during"]["failed"] = len(failures)
        ctx.out["initialize_during"]["first_failure"] = failures[0]
    ctx.out["peak_growth_mb"] = ctx.growth(ctx.trace.peak(started))


def made_up_sessions(ctx: Context) -> None:
    connection_id = rawhttp.initialize(ctx.port)
    statuses: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    for _ in range(MADE_UP_SESSIONS):
        with rawhttp.connect(ctx.port) as sock:
            sock.sendall(rawhttp.stream_request(connection_id, f"made-up-{uuid.uuid4().hex}"))
            answer = rawhttp.read_response(sock, 10.0, head_only=True)
            statuses[str(answer.status) if isinstance(answer, RawResponse) else "closed"] += 1
    ctx.out["seconds"] = round(time.monotonic() - started, 1)
    ctx.out["statuses"] = dict(statuses)
    ctx.trace.wait_flat(SETTINGS["after_flat_s"], SETTINGS["after_max_s"])
    ctx.out["growth_mb"] = ctx.growth(ctx.trace.now())


def abandoned(ctx: Context) -> None:
    statuses: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    opened = 0
    while time.monotonic() - started < ABANDON_SECONDS:
        answer = rawhttp.post_json(ctx.port, request(0, "initialize", {"protocolVersion": 1}), timeout=30.0)
        key = str(answer.status) if isinstance(answer, RawResponse) else "closed"
        statuses[key] += 1
        opened += key == "200"
    elapsed = time.monotonic() - started
    ctx.out["statuses"] = dict(statuses)
    ctx.out["connections"] = opened
    ctx.out["connections_per_s"] = round(opened / elapsed, 1)
    ctx.out["requests_per_s"] = round(sum(statuses.values()) / elapsed, 1)
    ctx.out["growth_mb"] = ctx.growth(ctx.trace.now())
    ctx.out["growth_per_1000_mb"] = round(ctx.growth(ctx.trace.now()) / opened * 1000, 1) if opened else None
    ctx.trace.wait_flat(SETTINGS["after_flat_s"], SETTINGS["after_max_s"])
    ctx.out["growth_settled_mb"] = ctx.growth(ctx.trace.now())


#: key -> (what, the function, extra server environment)
SCENARIOS: dict[str, tuple[str, Callable[[Context], None], dict[str, str]]] = {
    "a_sse_no_read": ("a. SSE client that never reads (`stream 400000 1024`)", sse_no_read, {}),
    "b_ws_no_read": ("b. WebSocket client that never reads (`stream 400000 1024`)", ws_no_read, {}),
    "c_body_content_length": ("c. 1 GiB POST body, Content-Length declared", body_content_length, {}),
    "c_body_chunked": ("c. 1 GiB POST body, chunked", body_chunked, {}),
    "d_batch_default": ("d. batch of 200,000 requests, default batch limit", batch, {}),
    # The pending-requests cap is raised with it: the batch's entries are all pending at once.
    "d_batch_200000": (
        "d. batch of 200,000 requests, ACP_MAX_BATCH_ENTRIES=200000 (and ACP_MAX_PENDING_REQUESTS=200000)",
        batch,
        {"ACP_MAX_BATCH_ENTRIES": str(BATCH_ENTRIES), "ACP_MAX_PENDING_REQUESTS": str(BATCH_ENTRIES)},
    ),
    "e_made_up_sessions": ("e. 2,000 GETs with made-up Acp-Session-Id", made_up_sessions, {}),
    "f_abandoned": ("f. initialize for 10 s without DELETE", abandoned, {}),
}


# -- large agent messages to clients that do not read (--scenarios large) ---------------------------

#: (chunk size in bytes, count): about 750 MB offered per connection, as `stream 50 15000000`.
LARGE_GRID = ((1_000_000, 750), (4_000_000, 185), (15_000_000, 50))
LARGE_CONNECTIONS = (1, 4)
#: Over dev.sh's --websocket-max-message-size 16781312 (bench.servers.MAX_MESSAGE, as here).
INBOUND_BYTES = 17_000_000
INBOUND_FRAGMENT = 1_000_000
PROMPT_ID = 2
#: A message a drained client receives is kept whole up to this size (to parse it); of a larger
#: one only its first and last bytes (where a chunk's update kind and a notice's method are).
SMALL_MESSAGE = 64 * 1024
MESSAGE_ENDS = 512
#: Merged into SETTINGS for --scenarios large.
LARGE_SETTINGS = {"drain_max_s": 15.0, "scenario_timeout_s": 180.0}
#: bench/quiet_agent/bench_quiet_agent.py: the demo agent keeping no copy of the chunks it sends.
QUIET_AGENT = {"ACP_AGENT": "bench_quiet_agent.create_agent"}


class MessageScan:
    """What a drained client received, message by message, without keeping the large ones: agent
    chunks, `_acp-channels/message_too_large` notices, the prompt's reply, anything else."""

    def __init__(self, sse: bool) -> None:
        self.sse = sse
        self.counts: collections.Counter[str] = collections.Counter()
        self.reply: Any = None
        self.notices: list[str] = []  # the first two notices' beginnings
        self.others: list[str] = []  # the same of other messages
        self.received = 0  # message bytes (SSE: the de-chunked body)
        self._head = bytearray()
        self._tail = b""
        self._whole: bytearray | None = bytearray()
        self._size = 0
        self._newline = False  # SSE: the last body piece ended with "\n"

    def add(self, piece: bytes) -> None:
        """Bytes of the current message."""
        self.received += len(piece)
        self._size += len(piece)
        if len(self._head) < MESSAGE_ENDS:
            self._head += piece[: MESSAGE_ENDS - len(self._head)]
        self._tail = (self._tail + piece[-MESSAGE_ENDS:])[-MESSAGE_ENDS:]
        if self._whole is not None:
            if self._size <= SMALL_MESSAGE:
                self._whole += piece
            else:
                self._whole = None

    def feed(self, data: bytes) -> None:
        """SSE body bytes: an event ends at a blank line."""
        start = 0
        if self._newline and data.startswith(b"\n"):
            self.end()
            start = 1
        while (end := data.find(b"\n\n", start)) >= 0:
            self.add(data[start:end])
            self.end()
            start = end + 2
        if start < len(data):
            self.add(data[start:])
        self._newline = data.endswith(b"\n")

    def end(self) -> None:
        """The current message is complete: classify it."""
        ends = bytes(self._head) + self._tail
        whole = bytes(self._whole) if self._whole is not None else None
        self._head, self._tail, self._whole, self._size = bytearray(), b"", bytearray(), 0
        if whole is not None and self.sse:
            data = [line[5:].strip() for line in whole.split(b"\n") if line.startswith(b"data:")]
            if not data:
                return  # a comment (keep-alive) or an id alone
            whole = b"\n".join(data)
        value = None
        if whole is not None:
            with contextlib.suppress(ValueError):
                value = json.loads(whole)
        if b"agent_message_chunk" in ends:
            self.counts["chunks"] += 1
        elif b"message_too_large" in ends:
            self.counts["too_large"] += 1
            if len(self.notices) < 2:
                self.notices.append(ends[:200].decode("utf-8", "replace"))
        elif isinstance(value, dict) and value.get("id") == PROMPT_ID and "method" not in value:
            self.reply = value
        else:
            self.counts["other"] += 1
            if len(self.others) < 2:
                self.others.append(ends[:160].decode("utf-8", "replace"))

    def summary(self, ending: str, chunks: bool = True) -> str:
        parts = [f"{self.counts['chunks']} chunks"] if chunks or self.counts["chunks"] else []
        if self.counts["too_large"]:
            parts.append(f"{self.counts['too_large']} message_too_large notices")
        if self.counts["other"]:
            parts.append(f"{self.counts['other']} other messages")
        reply = self.reply
        if isinstance(reply, dict) and isinstance(reply.get("result"), dict):
            parts.append(f"reply {reply['result'].get('stopReason')}")
        elif isinstance(reply, dict) and isinstance(reply.get("error"), dict):
            parts.append(f"error reply {reply['error'].get('code')} {str(reply['error'].get('message'))[:60]}")
        else:
            parts.append("no reply")
        if ending:
            parts.append(ending)
        return ", ".join(parts)


def closed_by_server(reader: rawhttp.Reader) -> str:
    return "then the server reset the socket" if reader.reset else "then the server closed the socket"


def drain_sse(sock: socket.socket, deadline: float) -> tuple[MessageScan, str]:
    """Read a session stream until the prompt's reply, its end, a close or the deadline."""
    scan = MessageScan(sse=True)
    reader = rawhttp.Reader(sock, deadline)
    try:
        head = reader.until(b"\r\n\r\n")
        if head is None:
            return scan, "closed before the stream's head"
        status, headers = rawhttp.parse_head(head[:-4])
        if status != 200:
            return scan, f"the stream answered {status}"
        if dict((k.lower(), v) for k, v in headers).get("transfer-encoding") != "chunked":
            while scan.reply is None:
                piece = reader.exactly(1) if not reader.buffer else b""
                if piece is None:
                    return scan, closed_by_server(reader)
                piece += bytes(reader.buffer)
                reader.buffer.clear()
                scan.feed(piece)
            return scan, ""
        while scan.reply is None:
            line = reader.until(b"\r\n")
            if line is None:
                return scan, closed_by_server(reader)
            left = int(line.split(b";")[0], 16)
            if left == 0:
                return scan, "then the stream ended"
            while left:
                piece = reader.exactly(min(left, MIB))
                if piece is None:
                    return scan, closed_by_server(reader)
                left -= len(piece)
                scan.feed(piece)
            if reader.exactly(2) is None:
                return scan, closed_by_server(reader)
    except rawhttp.Hang:
        return scan, "still streaming at the drain deadline"
    except OSError as error:
        return scan, f"then {type(error).__name__}"
    return scan, ""


def drain_ws(frames: WsReader, deadline: float) -> tuple[MessageScan, str]:
    """Read WebSocket messages until the prompt's reply, a close or the deadline; pings are
    answered."""
    scan = MessageScan(sse=False)
    reader = frames.reader
    reader.deadline = deadline
    try:
        while scan.reply is None:
            head = reader.exactly(2)
            if head is None:
                return scan, closed_by_server(reader)
            size = head[1] & 0x7F
            if size >= 126:
                more = reader.exactly(2 if size == 126 else 8)
                if more is None:
                    return scan, closed_by_server(reader)
                size = int.from_bytes(more, "big")
            opcode = head[0] & 0x0F
            if opcode >= 0x8:
                payload = reader.exactly(size) if size else b""
                if payload is None:
                    return scan, closed_by_server(reader)
                if opcode == rawhttp.CLOSE:
                    code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else "without a code"
                    reason = payload[2:].decode("utf-8", "replace")[:60]
                    return scan, f"then close {code}" + (f" ({reason})" if reason else "")
                if opcode == rawhttp.PING:
                    reader.sock.sendall(rawhttp.ws_frame(rawhttp.PONG, payload))
                continue
            left = size
            while left:
                piece = reader.exactly(min(left, MIB))
                if piece is None:
                    return scan, closed_by_server(reader)
                left -= len(piece)
                scan.add(piece)
            if head[0] & 0x80:
                scan.end()
    except rawhttp.Hang:
        return scan, "still streaming at the drain deadline"
    except OSError as error:
        return scan, f"then {type(error).__name__}"
    return scan, ""


class SseNonReader:
    """An ACP connection with a session whose stream is opened (4 KiB receive buffer) and not read."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connection_id, self.stream, self.session_id = open_session(port)
        self.sock = rawhttp.connect(port, rcvbuf=SLOW_RCVBUF)
        self.sock.sendall(rawhttp.stream_request(self.connection_id, self.session_id))

    def send_prompt(self, text: str) -> str:
        answer = rawhttp.post_json(
            self.port, prompt(PROMPT_ID, self.session_id, text), self.connection_id, self.session_id, timeout=30.0
        )
        accepted_ = isinstance(answer, RawResponse) and answer.status == 202
        return "" if accepted_ else f"prompt answered {response_summary(answer)}"

    def drain(self, deadline: float) -> tuple[MessageScan, str]:
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MIB)
        return drain_sse(self.sock, deadline)

    def close(self) -> None:
        self.sock.close()
        self.stream.close()


class WsNonReader:
    """A WebSocket (4 KiB receive buffer) read until session/new is answered, then not."""

    def __init__(self, port: int) -> None:
        self.sock, answer = rawhttp.ws_handshake(port, rcvbuf=SLOW_RCVBUF)
        if not isinstance(answer, RawResponse) or answer.status != 101:
            self.sock.close()
            raise RuntimeError(f"upgrade: {answer}")
        self.frames = WsReader(self.sock, answer.body)
        self.send(request(0, "initialize", {"protocolVersion": 1}))
        self.frames.json_until(0)
        self.send(request(1, "session/new", {"cwd": "/tmp", "mcpServers": []}))
        self.session_id = self.frames.json_until(1)["result"]["sessionId"]

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(rawhttp.ws_frame(rawhttp.TEXT, json.dumps(message).encode()))

    def send_prompt(self, text: str) -> str:
        self.send(prompt(PROMPT_ID, self.session_id, text))
        return ""

    def drain(self, deadline: float) -> tuple[MessageScan, str]:
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MIB)
        return drain_ws(self.frames, deadline)

    def close(self) -> None:
        self.sock.close()


def tally(sights: list[str]) -> str:
    """One line for what several clients saw: identical outcomes counted once."""
    if len(sights) == 1:
        return sights[0]
    return "; ".join(f"{count}× {sight}" for sight, count in collections.Counter(sights).items())


def probe_summary(probe: InitializeProbe, since: float, until: float, killed_at: float = 0.0) -> dict[str, Any]:
    """The probes started in [since, until]; with `killed_at`, failures that came after the server
    was killed at the cap are left out (counted as `cut_by_kill`)."""
    during = [(at, value) for at, value in probe.samples if since <= at <= until]
    cut = [
        at
        for at, value in during
        if killed_at and isinstance(value, str) and probe.finished.get(at, killed_at) >= killed_at
    ]
    during = [(at, value) for at, value in during if at not in cut]
    summary = latency_summary([v for _, v in during if isinstance(v, float)])
    if cut:
        summary["cut_by_kill"] = len(cut)
    failures = [v for _, v in during if isinstance(v, str)]
    if failures:
        summary["failed"] = len(failures)
        summary["first_failure"] = failures[0]
    return summary


@dataclass(frozen=True)
class Flood:
    """`stream <count> <size>` prompted on `connections` connections at once, none read."""

    transport: str  # "sse" or "ws"
    connections: int
    size: int
    count: int
    quiet: bool = False  # the agent keeps no copy of what it sends (QUIET_AGENT)

    @property
    def text(self) -> str:
        return f"stream {self.count} {self.size}"

    @property
    def key(self) -> str:
        return f"{self.transport}_{self.connections}x_{self.size // 1_000_000}mb" + ("_quiet" if self.quiet else "")

    @property
    def title(self) -> str:
        what = "SSE session stream never read" if self.transport == "sse" else "WebSocket never read"
        many = "1 connection" if self.connections == 1 else f"{self.connections} connections at once"
        return f"{what}, {many}, `{self.text}` each" + (", agent keeping no copy" if self.quiet else "")


def flood(spec: Flood, ctx: Context) -> None:
    """Open the connections, prompt on all, watch RSS while none reads (and probe another
    client's initialize), then drain each to see what it got, close, and watch again."""
    ctx.out["prompt"] = spec.text
    ctx.out["connections"] = spec.connections
    ctx.out["offered_mb"] = mb(spec.size * spec.count * spec.connections)
    kind = SseNonReader if spec.transport == "sse" else WsNonReader
    clients: list[SseNonReader | WsNonReader] = []
    probe: InitializeProbe | None = None
    try:
        for _ in range(spec.connections):
            clients.append(kind(ctx.port))
        ctx.out["initialize_idle"] = latency_summary(
            [s for s in (InitializeProbe(ctx.port).sample() for _ in range(5)) if isinstance(s, float)]
        )
        started = time.monotonic()
        probe = InitializeProbe(ctx.port, limit=int(SETTINGS["window_s"] / SETTINGS["probe_interval_s"]) + 1).start()
        refusals = [refusal for refusal in (client.send_prompt(spec.text) for client in clients) if refusal]
        if refusals:
            ctx.out["prompt_refused"] = tally(refusals)
        ctx.out["prompts_sent_s"] = round(time.monotonic() - started, 2)
        flat = ctx.trace.wait_flat(SETTINGS["flat_s"], SETTINGS["window_s"])
        watched = time.monotonic()
        ctx.out["watched_s"] = round(watched - started, 1)
        ctx.out["ended_by"] = "flat" if flat else "cap" if ctx.trace.stopped else "window"
        ctx.out["peak_growth_mb"] = ctx.growth(ctx.trace.peak(started))
        if not ctx.trace.stopped:
            ctx.out["growth_at_watch_end_mb"] = ctx.growth(ctx.trace.now())
        probe.stop()
        ctx.out["initialize_during"] = probe_summary(probe, started, watched, ctx.trace.stopped_at)
        probe = None
        if ctx.trace.stopped:
            ctx.out["client_saw"] = "not read: the server was killed at the cap"
            return
        drain_started = time.monotonic()
        deadline = drain_started + SETTINGS["drain_max_s"]
        drained: list[tuple[MessageScan, str] | None] = [None] * len(clients)

        def drain(index: int) -> None:
            drained[index] = clients[index].drain(deadline)

        threads = [threading.Thread(target=drain, args=(i,), daemon=True) for i in range(len(clients))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(SETTINGS["drain_max_s"] + 15)
        ctx.out["drain_s"] = round(time.monotonic() - drain_started, 1)
        done = [result for result in drained if result is not None]
        ctx.out["drained_mb"] = mb(sum(scan.received for scan, _ in done))
        ctx.out["client_saw"] = tally(
            [scan.summary(ending) for scan, ending in done] + ["drain did not return"] * (len(clients) - len(done))
        )
        for name, texts in (
            ("first_notice", [t for scan, _ in done for t in scan.notices]),
            ("first_other_message", [t for scan, _ in done for t in scan.others]),
        ):
            if texts:
                ctx.out[name] = texts[0]
    finally:
        if probe is not None:
            probe.stop()
        for client in clients:
            client.close()
    if ctx.trace.stopped:
        return
    left = time.monotonic()
    ctx.trace.wait_flat(SETTINGS["after_flat_s"], SETTINGS["after_max_s"])
    ctx.out["growth_after_clients_left_mb"] = ctx.growth(ctx.trace.now())
    ctx.out["settle_after_left_s"] = round(time.monotonic() - left, 1)
    ctx.out["peak_growth_whole_mb"] = ctx.growth(ctx.trace.peak(started))


def ws_inbound(fragments: bool, ctx: Context) -> None:
    """One 17 MB text message (a session/prompt) to a server whose WebSocket message limit is
    16781312 bytes: in one frame, or in 1 MB fragments; what the client sees, peak RSS."""
    sock, answer = rawhttp.ws_handshake(ctx.port)
    try:
        if not isinstance(answer, RawResponse) or answer.status != 101:
            raise RuntimeError(f"upgrade: {answer}")
        frames = WsReader(sock, answer.body)
        sock.sendall(
            rawhttp.ws_frame(rawhttp.TEXT, json.dumps(request(0, "initialize", {"protocolVersion": 1})).encode())
        )
        frames.json_until(0)
        sock.sendall(
            rawhttp.ws_frame(
                rawhttp.TEXT, json.dumps(request(1, "session/new", {"cwd": "/tmp", "mcpServers": []})).encode()
            )
        )
        session_id = frames.json_until(1)["result"]["sessionId"]
        envelope = len(json.dumps(prompt(PROMPT_ID, session_id, "")).encode())
        payload = json.dumps(prompt(PROMPT_ID, session_id, "x" * (INBOUND_BYTES - envelope))).encode()
        if fragments:
            pieces = [payload[at : at + INBOUND_FRAGMENT] for at in range(0, len(payload), INBOUND_FRAGMENT)]
            data = b"".join(
                rawhttp.ws_frame(rawhttp.TEXT if i == 0 else rawhttp.CONTINUATION, piece, fin=i == len(pieces) - 1)
                for i, piece in enumerate(pieces)
            )
        else:
            pieces = [payload]
            data = rawhttp.ws_frame(rawhttp.TEXT, payload)
        ctx.out["message_bytes"] = len(payload)
        ctx.out["frames"] = len(pieces)
        del payload, pieces
        outcome: list[tuple[MessageScan, str]] = []
        reader = threading.Thread(target=lambda: outcome.append(drain_ws(frames, time.monotonic() + 30.0)), daemon=True)
        started = time.monotonic()
        reader.start()
        sent = 0
        view = memoryview(data)
        try:
            while sent < len(data):
                sent += sock.send(view[sent : sent + MIB])
        except OSError as error:
            ctx.out["send_ended_by"] = type(error).__name__
        ctx.out["sent_mb"] = mb(sent)
        ctx.out["whole_message_sent"] = sent == len(data)
        del view, data
        reader.join(35.0)
        ctx.out["answered_after_s"] = round(time.monotonic() - started, 2)
        if outcome:
            scan, ending = outcome[0]
            ctx.out["client_saw"] = scan.summary(ending.removeprefix("then "), chunks=False)
        else:
            ctx.out["client_saw"] = "nothing within 30 s"
    finally:
        sock.close()
    ctx.out["peak_growth_mb"] = ctx.growth(ctx.trace.peak(started))
    if ctx.trace.stopped:
        return
    took = InitializeProbe(ctx.port).sample()
    ctx.out["initialize_after"] = round(took * 1000, 1) if isinstance(took, float) else took
    ctx.trace.wait_flat(SETTINGS["after_flat_s"], SETTINGS["after_max_s"])
    ctx.out["growth_after_mb"] = ctx.growth(ctx.trace.now())


#: The grid with the demo agent, then its largest chunks again with the agent keeping no copy.
FLOODS = [
    Flood(transport, connections, size, count, quiet)
    for transport in ("sse", "ws")
    for quiet, grid in ((False, LARGE_GRID), (True, LARGE_GRID[-1:]))
    for connections in LARGE_CONNECTIONS
    for size, count in grid
]
LARGE_SCENARIOS: dict[str, tuple[str, Callable[[Context], None], dict[str, str]]] = {
    **{spec.key: (spec.title, functools.partial(flood, spec), QUIET_AGENT if spec.quiet else {}) for spec in FLOODS},
    "ws_inbound_17mb": (
        "one 17 MB WebSocket text message in one frame (limit 16781312)",
        functools.partial(ws_inbound, False),
        {},
    ),
    "ws_inbound_17mb_fragments": (
        "one 17 MB WebSocket text message in 1 MB fragments (limit 16781312)",
        functools.partial(ws_inbound, True),
        {},
    ),
}


def run_scenario(scenario: tuple[str, Callable[[Context], None], dict[str, str]], root: Path) -> dict[str, Any]:
    _, function, env = scenario
    server = start_server(root, env)
    out: dict[str, Any] = {}
    if env:
        out["env"] = env
    trace = RssTrace(server.pid)
    started = time.monotonic()
    try:
        warm_up(server.port)
        trace.wait_flat(1.0, 5.0)
        ctx = Context(server, trace, trace.now(), out)
        out["baseline_mb"] = mb(ctx.baseline)
        failure: list[BaseException] = []

        def body() -> None:
            try:
                function(ctx)
            except BaseException as error:
                failure.append(error)

        worker = threading.Thread(target=body, daemon=True)
        worker.start()
        worker.join(SETTINGS["scenario_timeout_s"])
        if worker.is_alive():
            out["error"] = f"timed out after {SETTINGS['scenario_timeout_s']:g} s"
        elif failure:
            out["error"] = f"{type(failure[0]).__name__}: {str(failure[0])[:200]}"
    except Exception as error:
        out["error"] = f"{type(error).__name__}: {str(error)[:200]}"
    finally:
        trace.stop()
        server.stop()
        if trace.stopped:
            out["stopped"] = trace.stopped
        out["scenario_s"] = round(time.monotonic() - started, 1)
        errors = server.errors()
        out["server_errors"] = len(errors)
        if errors:
            out["server_error_lines"] = [line.rstrip() for line in errors[:3]]
    return out


# -- results ----------------------------------------------------------------------------------------


def describe(root: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()

    dirty = " (dirty)" if git("status", "--porcelain", "acp_channels", "demo_project") else ""
    return {
        "server_root": str(root),
        "commit": git("rev-parse", "--short", "HEAD") + dirty,
        "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
    }


def run(root: Path, group: Group, selected: list[str], label: str) -> dict[str, Any]:
    results: dict[str, Any] = {
        "meta": {
            "label": label,
            **describe(root),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(),
            "settings": SETTINGS,
            "pinning": f"server on CPU {SERVER_CPU}, clients on CPU {LOADGEN_CPU}",
            "python": sys.version.split()[0],
        },
        "scenarios": {},
    }
    started = time.monotonic()
    for key in selected:
        log(f"{key}: {group.scenarios[key][0]}")
        results["scenarios"][key] = outcome = run_scenario(group.scenarios[key], root)
        log("  ", json.dumps(outcome))
    results["meta"]["duration_s"] = round(time.monotonic() - started)
    return results


#: Table rows: (scenario, field, label). Each figure of a results file appears once.
ROWS: list[tuple[str, str, str]] = [
    ("a_sse_no_read", "peak_growth_mb", "peak RSS growth while the client does not read (MB)"),
    ("a_sse_no_read", "watched_s", "watched for (s)"),
    ("a_sse_no_read", "ended_by", "watch ended by (flat 3 s / window)"),
    ("a_sse_no_read", "growth_at_close_mb", "RSS growth when the client closed (MB)"),
    ("a_sse_no_read", "growth_after_client_left_mb", "RSS growth after the client left (MB)"),
    ("a_sse_no_read", "settle_after_left_s", "settled after (s)"),
    ("a_sse_no_read", "peak_growth_whole_mb", "peak RSS growth, whole scenario (MB)"),
    ("b_ws_no_read", "peak_growth_mb", "peak RSS growth while the client does not read (MB)"),
    ("b_ws_no_read", "watched_s", "watched for (s)"),
    ("b_ws_no_read", "ended_by", "watch ended by (flat 3 s / window)"),
    ("b_ws_no_read", "growth_at_close_mb", "RSS growth when the client closed (MB)"),
    ("b_ws_no_read", "growth_after_client_left_mb", "RSS growth after the client left (MB)"),
    ("b_ws_no_read", "settle_after_left_s", "settled after (s)"),
    ("b_ws_no_read", "peak_growth_whole_mb", "peak RSS growth, whole scenario (MB)"),
    ("c_body_content_length", "answer", "answer"),
    ("c_body_content_length", "answered_after_s", "answered after (s)"),
    ("c_body_content_length", "sent_before_answer_mb", "body sent before the answer (MB)"),
    ("c_body_content_length", "peak_growth_mb", "peak RSS growth (MB)"),
    ("c_body_content_length", "growth_after_mb", "RSS growth afterwards (MB)"),
    ("c_body_chunked", "answer", "answer"),
    ("c_body_chunked", "answered_after_s", "answered after (s)"),
    ("c_body_chunked", "sent_before_answer_mb", "body sent before the answer (MB, with chunk framing)"),
    ("c_body_chunked", "peak_growth_mb", "peak RSS growth (MB)"),
    ("c_body_chunked", "growth_after_mb", "RSS growth afterwards (MB)"),
    ("d_batch_default", "body_mb", "body (MB)"),
    ("d_batch_default", "post_answer", "POST answer"),
    ("d_batch_default", "post_answered_after_s", "POST answered after (s)"),
    ("d_batch_default", "reply", "reply on the connection stream"),
    ("d_batch_default", "processing_s", "POST sent -> reply or error (s)"),
    ("d_batch_default", "peak_growth_mb", "peak RSS growth (MB)"),
    ("d_batch_default", "initialize_idle", "another client's initialize, idle server (ms)"),
    ("d_batch_default", "initialize_during", "another client's initialize during the batch (ms)"),
    ("d_batch_200000", "post_answer", "POST answer"),
    ("d_batch_200000", "post_answered_after_s", "POST answered after (s)"),
    ("d_batch_200000", "reply", "reply on the connection stream"),
    ("d_batch_200000", "processing_s", "POST sent -> reply or error (s)"),
    ("d_batch_200000", "peak_growth_mb", "peak RSS growth (MB)"),
    ("d_batch_200000", "initialize_idle", "another client's initialize, idle server (ms)"),
    ("d_batch_200000", "initialize_during", "another client's initialize during the batch (ms)"),
    ("e_made_up_sessions", "statuses", "statuses"),
    ("e_made_up_sessions", "seconds", "took (s)"),
    ("e_made_up_sessions", "growth_mb", "RSS growth after (MB)"),
    ("f_abandoned", "connections", "connections opened"),
    ("f_abandoned", "connections_per_s", "connections opened per second"),
    ("f_abandoned", "requests_per_s", "initialize requests answered per second"),
    ("f_abandoned", "statuses", "statuses"),
    ("f_abandoned", "growth_mb", "RSS growth at the end (MB)"),
    ("f_abandoned", "growth_per_1000_mb", "RSS growth per 1,000 connections (MB)"),
    ("f_abandoned", "growth_settled_mb", "RSS growth once settled (MB)"),
]
#: The same for --scenarios large.
LARGE_ROWS: list[tuple[str, str, str]] = [
    *(
        (spec.key, name, label)
        for spec in FLOODS
        for name, label in (
            ("offered_mb", "offered, all connections together (MiB)"),
            ("peak_growth_mb", "peak RSS growth while the clients do not read (MiB)"),
            ("watched_s", "watched for (s)"),
            ("ended_by", "watch ended by (flat 3 s / window / cap)"),
            ("initialize_idle", "another client's initialize, idle server (ms)"),
            ("initialize_during", "another client's initialize during the watch (ms)"),
            ("client_saw", f"what the clients got once they read (at most {LARGE_SETTINGS['drain_max_s']:g} s)"),
            ("drained_mb", "read by the clients then (MiB)"),
            ("drain_s", "reading took (s)"),
            ("growth_after_clients_left_mb", "RSS growth after the clients left (MiB)"),
            ("peak_growth_whole_mb", "peak RSS growth, whole scenario (MiB)"),
        )
    ),
    *(
        (key, name, label)
        for key in ("ws_inbound_17mb", "ws_inbound_17mb_fragments")
        for name, label in (
            ("message_bytes", "message (bytes)"),
            ("frames", "frames"),
            ("client_saw", "what the client got"),
            ("answered_after_s", "answered after (s)"),
            ("sent_mb", "sent before the answer (MiB)"),
            ("peak_growth_mb", "peak RSS growth (MiB)"),
            ("growth_after_mb", "RSS growth afterwards (MiB)"),
            ("initialize_after", "another client's initialize right after (ms)"),
        )
    ),
]
#: Shown per scenario below the figures, not in the table.
EXTRA = (
    "baseline_mb",
    "scenario_s",
    "server_errors",
    "server_error_lines",
    "error",
    "env",
    "note",
    "stopped",
    "prompts_sent_s",
    "prompt_refused",
    "growth_at_watch_end_mb",
    "settle_after_left_s",
    "first_notice",
    "first_other_message",
    "send_ended_by",
)


@dataclass(frozen=True)
class Group:
    """A set of scenarios with its results files and its report."""

    scenarios: dict[str, tuple[str, Callable[[Context], None], dict[str, str]]]
    rows: list[tuple[str, str, str]]
    results: str  # the current code's results file, in bench/
    before: str  # the code before, in bench/
    report: str
    title: str
    command: str
    note: str
    settings: dict[str, float] = field(default_factory=dict)
    summary: Callable[[list[dict[str, Any]], list[str]], list[str]] | None = None


def large_summary(runs: list[dict[str, Any]], names: list[str]) -> list[str]:
    """Peak RSS growth against chunk size x count, one column per run and connection count."""
    columns = [
        (run, name, connections) for run, name in zip(runs, names, strict=True) for connections in LARGE_CONNECTIONS
    ]
    lines = [
        "## Peak RSS growth while the clients do not read (MiB)",
        "",
        "| transport | prompt on each connection | agent | offered per connection (MiB) | "
        + " | ".join(f"{name}, {n} connection{'s' if n > 1 else ''}" for _, name, n in columns)
        + " |",
        "|---|---|---|---|" + "---|" * len(columns),
    ]
    what = {"sse": "SSE (session stream)", "ws": "WebSocket"}
    for transport, size, count, quiet in dict.fromkeys((s.transport, s.size, s.count, s.quiet) for s in FLOODS):
        values = []
        for run, _, connections in columns:
            outcome = run["scenarios"].get(Flood(transport, connections, size, count, quiet).key)
            if outcome is None:
                values.append("not run")
            elif "peak_growth_mb" not in outcome:
                values.append("failed")
            else:
                values.append(
                    cell(outcome["peak_growth_mb"]) + (" (stopped at cap)" if outcome.get("ended_by") == "cap" else "")
                )
        agent = "demo, keeping no copy" if quiet else "demo"
        lines.append(
            f"| {what[transport]} | `stream {count} {size}` | {agent} | {cell(mb(size * count))} | "
            + " | ".join(values)
            + " |"
        )
    return [*lines, "", "## Every figure", ""]


GROUPS: dict[str, Group] = {
    "hostile": Group(
        SCENARIOS,
        ROWS,
        "adversarial.json",
        "adversarial-before.json",
        "ADVERSARIAL.md",
        "Hostile and slow clients: what they cost the server",
        "python -m bench.adversarial",
        "RSS growth is against the server's RSS after one warm-up connection; each scenario ran on a fresh daphne.",
    ),
    "large": Group(
        LARGE_SCENARIOS,
        LARGE_ROWS,
        "adversarial-large.json",
        "adversarial-large-before.json",
        "ADVERSARIAL-LARGE.md",
        "Large agent messages to clients that do not read",
        "python -m bench.adversarial --scenarios large",
        "RSS growth is against the server's RSS after one warm-up connection, in MiB; chunk sizes are "
        "bytes; each scenario ran on a fresh daphne (`--websocket-max-message-size 16781312`, as "
        "`./dev.sh demo`) with the demo's default settings. A client that does not read has a 4 KiB "
        "receive buffer; after the watch each reads what it was sent (pings answered) until the "
        f"prompt's reply, a close or {LARGE_SETTINGS['drain_max_s']:g} s, to show what it got. The demo "
        "agent keeps a copy of every chunk it sends (the turn's output, joined into its transcript when "
        "the turn ends: up to twice what it streams, in the same process); the rows *keeping no copy* "
        "run the same agent without it (bench/quiet_agent), so what they show is the server's own. "
        "The server is killed when its RSS passes the cap (`rss_cap_mb`) or the machine's MemAvailable "
        "falls under `min_available_mb`.",
        LARGE_SETTINGS,
        large_summary,
    ),
}


def cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, dict) and "n" in value:
        cut = f"; {value['cut_by_kill']} cut short by the kill at the cap" if value.get("cut_by_kill") else ""
        if not value["n"]:
            return "no sample" + (f" ({value.get('failed', 0)} failed)" if value.get("failed") else "") + cut
        text = f"median {value['median_ms']:g}, max {value['max_ms']:g} (n={value['n']})"
        if value.get("failed"):
            text += f"; {value['failed']} failed: {value['first_failure']}"
        return (text + cut).replace("|", "\\|")
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def render(runs: list[dict[str, Any]], group: Group = GROUPS["hostile"]) -> str:
    """The group's report (ADVERSARIAL.md, ADVERSARIAL-LARGE.md) from one or more results files
    (one column each)."""
    names = [f"{run['meta']['label']} ({run['meta']['commit']})" for run in runs]
    lines = [
        f"# {group.title}",
        "",
        f"Generated by `{group.command}` (bench/adversarial.py; method in bench/README.md) "
        "from " + ", ".join(f"`{run['meta'].get('file', '?')}`" for run in runs) + ". " + group.note,
        "",
        *(group.summary(runs, names) if group.summary else []),
        "| scenario | figure | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(runs),
    ]
    previous = ""
    for key, name, label in group.rows:
        title = group.scenarios[key][0] if key != previous else ""
        previous = key
        values = []
        for run in runs:
            outcome = run["scenarios"].get(key)
            if outcome is None:
                values.append("not run")
            elif "error" in outcome and name not in outcome:
                values.append("failed")
            else:
                values.append(cell(outcome.get(name)))
        lines.append(f"| {title} | {label} | " + " | ".join(values) + " |")
    lines += ["", "## Runs", ""]
    for name, run in zip(names, runs, strict=True):
        meta = run["meta"]
        machine_info = meta["machine"]
        lines += [
            f"### {name}",
            "",
            f"- server root `{meta['server_root']}`, branch `{meta['branch']}`, commit `{meta['commit']}`; "
            f"{meta['date']}; whole run {meta['duration_s']} s",
            f"- {machine_info['cpu']}, {machine_info['nproc']} CPUs, {machine_info['memory']}, "
            f"kernel {machine_info['kernel']}, Python {meta['python']}; {meta['pinning']}",
            "- settings: " + ", ".join(f"{k} {v:g}" for k, v in meta["settings"].items()),
        ]
        for key, outcome in run["scenarios"].items():
            shown = {name for row_key, name, _ in group.rows if row_key == key}
            extra = [f"{k} {cell(outcome[k])}" for k in EXTRA if k in outcome and k not in shown]
            lines.append(f"- {key}: " + "; ".join(extra))
        lines.append("")
    return "\n".join(lines)


def write_report(paths: list[Path], group: Group) -> None:
    target = HERE / group.report
    runs = []
    for path in paths:
        run_data = json.loads(path.read_text())
        run_data["meta"]["file"] = str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
        runs.append(run_data)
    target.write_text(render(runs, group))
    log(f"wrote {target}")


def default_report_inputs(group: Group) -> list[Path]:
    return [path for path in (HERE / group.before, HERE / group.results) if path.exists()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server-root", default=str(ROOT), help="checkout whose daphne + demo to measure")
    parser.add_argument(
        "--scenarios",
        choices=GROUPS,
        default="hostile",
        help="hostile: a-f (ADVERSARIAL.md); large: large agent messages to clients that do not "
        "read and one oversized inbound WebSocket message (ADVERSARIAL-LARGE.md)",
    )
    parser.add_argument(
        "--out",
        help="results file (default bench/adversarial.json, with --scenarios large bench/adversarial-large.json)",
    )
    parser.add_argument("--label", default="", help="column title (default: before/after by file name)")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated subset of the group's scenarios: "
        + "; ".join(f"{name}: {','.join(group.scenarios)}" for name, group in GROUPS.items()),
    )
    parser.add_argument(
        "--window", type=float, default=SETTINGS["window_s"], help="longest watch of a client that does not read (s)"
    )
    parser.add_argument(
        "--render",
        nargs="*",
        metavar="RESULTS",
        help="only write the group's report from these results files (default: the standard ones)",
    )
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    group = GROUPS[args.scenarios]
    if args.render is not None:
        write_report([Path(p).resolve() for p in args.render] or default_report_inputs(group), group)
        return
    SETTINGS.update(group.settings)
    SETTINGS["window_s"] = args.window
    os.sched_setaffinity(0, {LOADGEN_CPU})
    unknown = set(filter(None, args.only.split(","))) - set(group.scenarios)
    if unknown:
        parser.error(f"not in --scenarios {args.scenarios}: {', '.join(sorted(unknown))}")
    selected = [key for key in group.scenarios if not args.only or key in args.only.split(",")]
    out = Path(args.out or HERE / group.results).resolve()
    label = args.label or ("before" if "before" in out.name else "after")
    results = run(Path(args.server_root).resolve(), group, selected, label)
    out.write_text(json.dumps(results, indent=1) + "\n")
    log(f"done in {results['meta']['duration_s']} s: {out}")
    if not args.no_report:
        write_report(default_report_inputs(group), group)


if __name__ == "__main__":
    main()
