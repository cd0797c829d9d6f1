"""What resumable streams cost (docs/resumable-streams.md): event ids and the replay window,
against the same server without them. Writes bench/resume-cost.json and bench/RESUME.md.

    .venv/bin/python -m bench.resume_cost            # about 3-4 minutes on 2 cores
    .venv/bin/python -m bench.resume_cost --quick    # smaller sizes, one repetition (about 1.5 minutes)
    .venv/bin/python -m bench.resume_cost --report   # RESUME.md again from the results files
    .venv/bin/python -m bench.resume_cost --family uvicorn   # the same three variants under uvicorn
                                                             # (-> resume-cost-uvicorn.json, also in RESUME.md)

Three variants of one server (bench/servers.py), all started at once, each pinned to the server
core, the load generator on the other core (as bench.run pins them):

- `ours-daphne`: as shipped, an `id:` line on every SSE event and a replay window per stream
  (the REPLAY_WINDOW_EVENTS and REPLAY_WINDOW_BYTES defaults of acp_channels._conf);
- `ours-daphne-nowindow`: ids, window settings 0;
- `ours-daphne-noids`: no id lines and no window (bench/asgi_no_ids.py), the baseline.

A probe first checks each variant is what it claims: the window advertised by initialize
(`result._meta`), and whether a stream chunk's SSE event has an `id:` line (and its size).

*Rates*: per variant and transport (HTTP+SSE, WebSocket) one client, warmed up (a stream and
some echo turns). Then 3 repetitions; in each, per transport, short blocks with the variants
in turns (the one going first changes every block), so that whatever else the machine does
falls on all three alike: B blocks of *stream* (one prompt `stream N 64`; every chunk once, in
order, before the reply), then B blocks of *rtt* (sequential `echo` prompts). Per repetition:
messages/s over its stream blocks (prompt sent to reply received), rtt percentiles over its
echo turns. Besides the wall clock, the CPU time the server's event-loop thread used (/proc
schedstat, in ns) per message and per turn: the ids and the window are computed on that
thread, and its CPU time depends less than the wall-clock rate on what else runs on the
machine (shared caches, and on a virtual machine the hypervisor's steal, still inflate it).
The time it spent runnable but waiting for the core, and the server core's steal over the
phase, say how much else ran there. Medians over the repetitions.

*Memory*: the window on (ours-daphne) and off (-nowindow), each on a fresh server whose agent
forgets its transcript after each turn (bench/agent_no_history.py; the demo agent keeps it for
session/load, which would grow with every stream), per transport: RSS after one warm-up
connection, after K more connections opened, and after each round in which each of the K
connections streams `stream M 1024` (about M x 1.2 kB per stream per round, several times the
window's 1 MiB); connections stay open, so their windows stay. With a bounded window RSS stays
flat from round to round, about K MiB above the window-off run.

*Micro*: the two pieces of code that differ, in one process on the server core: the SSE
encoding of a batch (`sse_event` with and without `event_id`) and the mailbox cycle (push,
take, settle) with the window on and off; nanoseconds per event.

*Profile* (py-spy, unless --no-profile): the shares of the server's on-CPU samples in the
functions ids and window touch, on `ours-<family>` while it streams.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from acp_channels._conf import DEFAULTS

#: The shipped window: what `ours-daphne` runs with.
WINDOW_EVENTS: int = DEFAULTS["REPLAY_WINDOW_EVENTS"]
WINDOW_BYTES: int = DEFAULTS["REPLAY_WINDOW_BYTES"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FAMILIES = {
    "daphne": ["ours-daphne", "ours-daphne-nowindow", "ours-daphne-noids"],
    "uvicorn": ["ours-uvicorn", "ours-uvicorn-nowindow", "ours-uvicorn-noids"],
}
#: What each variant of a family has: (ids on SSE events, replay window).
ROLES = [(True, True), (True, False), (False, False)]
ROLE_LABELS = ["ids + window (as shipped)", "ids, no window", "no ids, no window (baseline)"]
TRANSPORTS = ("http", "ws")
TRANSPORT_LABELS = {"http": "HTTP+SSE", "ws": "WebSocket"}
RESULTS = {"daphne": HERE / "resume-cost.json", "uvicorn": HERE / "resume-cost-uvicorn.json"}
REPORT = HERE / "RESUME.md"

FULL = {
    "warmup": 20000,
    "stream_block": 8000,
    "rtt_block": 150,
    "blocks": 8,
    "reps": 3,
    "mem_clients": 16,
    "mem_events": 3000,
    "mem_chunk": 1024,
    "mem_rounds": 3,
    "micro_events": 100000,
    "micro_batch": 16,
    "profile_stream": 50000,
    "profile_repeat": 3,
    "profile_rate": 500,
}
QUICK = {
    "warmup": 5000,
    "stream_block": 5000,
    "rtt_block": 100,
    "blocks": 4,
    "reps": 1,
    "mem_clients": 8,
    "mem_events": 3000,
    "mem_chunk": 1024,
    "mem_rounds": 2,
    "micro_events": 50000,
    "micro_batch": 16,
    "profile_stream": 30000,
    "profile_repeat": 2,
    "profile_rate": 500,
}


def log(*parts: Any) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


# -- in-process micro-benchmark (run in a child process pinned to the server core) ---------------

MICRO_ROUNDS = 9


def micro(events: int, batch: int) -> dict[str, Any]:
    """Nanoseconds per event of the code that ids and the window add, in isolation."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
    import django

    django.setup()
    from acp_channels import _protocol as protocol
    from acp_channels._host import Mailbox, OutboundBudget
    from acp_channels._protocol import event_id

    def frame(index: int) -> str:  # a demo-agent chunk as the host serializes it
        text = f"{index:05d}:".ljust(64, "x")
        update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
        message = {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s" * 32, "update": update}}
        return protocol.dumps(message)

    items = [frame(i) for i in range(events)]
    batches = [items[i : i + batch] for i in range(0, events, batch)]

    def no_id(tag: str, seq: int) -> None:
        return None

    def encode(name_event: Callable[[str, int], str | None]) -> float:
        sse_event = protocol.sse_event
        tag = "0a1b2c3d"
        started = time.perf_counter_ns()
        seq = 1
        for items_ in batches:  # as views.sse_body writes one batch
            b"".join(sse_event(item, name_event(tag, s)) for s, item in enumerate(items_, seq))
            seq += len(items_)
        return (time.perf_counter_ns() - started) / events

    async def cycle(window_events: int, window_bytes: int) -> float:
        box = Mailbox(OutboundBudget(1 << 40), window_events=window_events, window_bytes=window_bytes)
        token = box.acquire()
        started = time.perf_counter_ns()
        for items_ in batches:  # the agent pushes a few items, the reader takes them
            for item in items_:
                box.push(item)
            await box.take(None, holder=token)
        box.settle()
        return (time.perf_counter_ns() - started) / events

    measures: dict[str, Callable[[], float]] = {
        "encode_with_id_ns": lambda: encode(event_id),
        "encode_without_id_ns": lambda: encode(no_id),
        "event_id_only_ns": lambda: _time_calls(event_id, events),
        "mailbox_window_ns": lambda: asyncio.run(cycle(WINDOW_EVENTS, WINDOW_BYTES)),
        "mailbox_no_window_ns": lambda: asyncio.run(cycle(0, 0)),
    }
    runs: dict[str, list[float]] = {name: [] for name in measures}
    for round_ in range(MICRO_ROUNDS + 1):  # in turns, so a busy moment hits all alike; the first warms up
        for name, measure in measures.items():
            if round_:
                runs[name].append(measure())
            else:
                measure()
    out: dict[str, Any] = {"events": events, "batch": batch, "frame_chars": len(items[0]), "rounds": MICRO_ROUNDS}
    out.update({name: min(values) for name, values in runs.items()})
    out["medians"] = {name: statistics.median(values) for name, values in runs.items()}
    return out


def _time_calls(function: Callable[[str, int], str], count: int) -> float:
    started = time.perf_counter_ns()
    for seq in range(count):
        function("0a1b2c3d", seq)
    return (time.perf_counter_ns() - started) / count


def run_micro(sizes: dict[str, Any]) -> dict[str, Any]:
    from bench.servers import SERVER_CPU

    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "demo_project.settings"}
    result = subprocess.run(
        ["taskset", "-c", SERVER_CPU, sys.executable, "-m", "bench.resume_cost", "--micro",
         f"{sizes['micro_events']},{sizes['micro_batch']}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if result.returncode:
        raise RuntimeError(result.stderr[-2000:])
    return dict(json.loads(result.stdout))


# -- the servers ---------------------------------------------------------------------------------


def cpu_ticks(cpu: str) -> tuple[int, int, int]:
    """(busy, steal, total) clock ticks of one CPU so far (/proc/stat): steal is time the
    hypervisor gave this virtual CPU to someone else."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            user, nice, system, idle, iowait, irq, softirq, steal = (int(n) for n in line.split()[1:9])
            busy = user + nice + system + irq + softirq
            return busy, steal, busy + idle + iowait + steal
    return 0, 0, 0


def loop_cpu(pid: int) -> tuple[int, int]:
    """(ns on the CPU, ns runnable but waiting) of the process's main thread (the event loop)."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as stat:
        on_cpu, waiting, _ = stat.read().split()
    return int(on_cpu), int(waiting)


async def probe(url: str) -> dict[str, Any]:
    """What a variant advertises and sends: initialize's resume `_meta`, and the SSE event of one
    stream chunk (with or without an `id:` line)."""
    import httpx
    import orjson

    from bench.client import INIT_PARAMS, JSON, SSE

    async def blocks(response: httpx.Response) -> Any:
        pending = ""
        async for text in response.aiter_text():
            pending += text
            *complete, pending = pending.split("\n\n")
            for block in complete:
                yield block

    def rpc(request_id: int, method: str, params: Any) -> bytes:
        return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})

    async with httpx.AsyncClient(timeout=20) as http:
        reply = await http.post(url, content=rpc(0, "initialize", INIT_PARAMS), headers=JSON)
        meta = reply.json()["result"].get("_meta", {}).get("acp-channels/resume")
        connection = {"Acp-Connection-Id": reply.headers["acp-connection-id"]}
        async with http.stream("GET", url, headers={**SSE, **connection}) as connection_stream:
            posted = await http.post(url, content=rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []}),
                                     headers={**JSON, **connection})  # fmt: skip
            assert posted.status_code == 202, posted.text
            session = ""
            async for block in blocks(connection_stream):
                if '"sessionId"' in block:
                    data = next(line for line in block.split("\n") if line.startswith("data: "))
                    session = orjson.loads(data[6:])["result"]["sessionId"]
                    break
        headers = {**connection, "Acp-Session-Id": session}
        async with http.stream("GET", url, headers={**SSE, **headers}) as session_stream:
            prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "stream 3 64"}]}
            posted = await http.post(url, content=rpc(2, "session/prompt", prompt), headers={**JSON, **headers})
            assert posted.status_code == 202, posted.text
            chunk = ""
            async for block in blocks(session_stream):
                if "agent_message_chunk" in block:
                    chunk = block
                    break
        await http.delete(url, headers=connection)
    return {
        "advertised": meta,
        "id_line": next((line for line in chunk.split("\n") if line.startswith("id:")), None),
        "chunk_event_bytes": len(chunk.encode()) + 2,
    }


def check_probe(key: str, role: tuple[bool, bool], seen: dict[str, Any]) -> None:
    ids, window = role
    advertised = seen["advertised"] or {}
    if (seen["id_line"] is not None) != ids:
        raise RuntimeError(f"{key}: id line {seen['id_line']!r}, expected {'one' if ids else 'none'}")
    if bool(advertised.get("windowEvents")) != window or bool(advertised.get("windowBytes")) != window:
        raise RuntimeError(f"{key}: advertises {advertised}, expected the window {'on' if window else 'off'}")


async def rates(keys: list[str], sizes: dict[str, Any]) -> dict[str, Any]:
    from bench import scenarios
    from bench.client import make_client
    from bench.run import percentiles
    from bench.servers import SERVERS

    servers = [SERVERS[key]() for key in keys]
    out: dict[str, Any] = {"probe": {}, "variants": {}}
    clients: dict[tuple[str, str], Any] = {}
    try:
        for server in servers:
            server.start()
        for key, role, server in zip(keys, ROLES, servers, strict=True):
            out["probe"][key] = seen = await probe(server.url)
            check_probe(key, role, seen)
            log(f"  {key}: {seen['advertised']}, chunk event {seen['chunk_event_bytes']} bytes, {seen['id_line']!r}")
        for key, server in zip(keys, servers, strict=True):
            for transport in TRANSPORTS:
                client = make_client(transport, server.url, **server.client_options)
                await client.open()
                await client.new_session()
                await scenarios.run_stream(client, sizes["warmup"])
                await scenarios.run_rtt(client, sizes["rtt_block"])
                clients[key, transport] = client
        raw: dict[str, dict[str, dict[str, list[Any]]]] = {
            key: {t: {"stream": [], "stream_cpu": [], "rtt": [], "rtt_cpu": []} for t in TRANSPORTS} for key in keys
        }
        pids = {key: server.procs[0].pid for key, server in zip(keys, servers, strict=True)}
        for rep in range(sizes["reps"]):
            for transport in TRANSPORTS:
                tally = {key: Tally() for key in keys}
                for block in range(sizes["blocks"]):  # stream blocks, the variants in turns
                    for key in rotated(keys, rep * sizes["blocks"] + block):
                        before = loop_cpu(pids[key])
                        result = await scenarios.run_stream(clients[key, transport], sizes["stream_block"])
                        tally[key].add(before, loop_cpu(pids[key]), result["messages"], result["seconds"])
                rtt_samples: dict[str, list[float]] = {key: [] for key in keys}
                rtt_tally = {key: Tally() for key in keys}
                for block in range(sizes["blocks"]):  # then echo blocks, likewise
                    for key in rotated(keys, rep * sizes["blocks"] + block):
                        before = loop_cpu(pids[key])
                        samples = await scenarios.run_rtt(clients[key, transport], sizes["rtt_block"])
                        rtt_tally[key].add(before, loop_cpu(pids[key]), len(samples), sum(samples))
                        rtt_samples[key] += samples
                for key in keys:
                    entry = raw[key][transport]
                    entry["stream"].append(tally[key].count / tally[key].seconds)
                    entry["stream_cpu"].append(tally[key].figures())
                    entry["rtt"].append(percentiles(rtt_samples[key]))
                    entry["rtt_cpu"].append(rtt_tally[key].figures())
                    log(f"  rep {rep + 1} {transport} {key}: stream {entry['stream'][-1]:,.0f} msg/s "
                        f"({entry['stream_cpu'][-1]['us_per_event']:.2f} us loop CPU each, "
                        f"waiting {entry['stream_cpu'][-1]['wait_share']:.0%}), "
                        f"rtt p50 {entry['rtt'][-1]['p50']:.3f} ms")  # fmt: skip
        for (key, transport), client in clients.items():
            if client.unexpected:
                raise scenarios.ProtocolError(f"{key} {transport}: unexpected messages {client.unexpected[:3]}")
            await client.close()
        for key in keys:
            out["variants"][key] = {transport: summarize(raw[key][transport]) for transport in TRANSPORTS}
    finally:
        for server in servers:
            server.stop()
        out["server_errors"] = [line for server in servers for line in server.errors()][:10]
    return out


def rotated(keys: list[str], turn: int) -> list[str]:
    """The variants in the order of this turn: each one goes first, second, third in turn."""
    shift = turn % len(keys)
    return [*keys[shift:], *keys[:shift]]


class Tally:
    """Messages, wall time and the server loop thread's CPU over several blocks of one variant."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self.on_cpu = 0
        self.waiting = 0
        self.blocks: list[float] = []  # loop CPU µs per message of each block

    def add(self, before: tuple[int, int], after: tuple[int, int], count: int, seconds: float) -> None:
        self.on_cpu += after[0] - before[0]
        self.waiting += after[1] - before[1]
        self.count += count
        self.seconds += seconds
        self.blocks.append((after[0] - before[0]) / count / 1000)

    def figures(self) -> dict[str, float]:
        return {
            "us_per_event": self.on_cpu / self.count / 1000,
            "busy_share": self.on_cpu / 1e9 / self.seconds,
            "wait_share": self.waiting / 1e9 / self.seconds,
            "best_block_us_per_event": min(self.blocks),
        }


def summarize(entry: dict[str, list[Any]]) -> dict[str, Any]:
    def medians(dicts: list[dict[str, float]]) -> dict[str, float]:
        return {key: statistics.median(d[key] for d in dicts) for key in dicts[0]}

    return {
        "stream": entry["stream"],
        "stream_msg_per_s": statistics.median(entry["stream"]),
        "stream_cpu": medians(entry["stream_cpu"]),
        "stream_cpu_runs": [run["us_per_event"] for run in entry["stream_cpu"]],
        # Contention only adds CPU time (cache misses, steal): the least a block took is the
        # figure least disturbed by the rest of the machine.
        "stream_cpu_best_block": min(run["best_block_us_per_event"] for run in entry["stream_cpu"]),
        "rtt": medians(entry["rtt"]),
        "rtt_p50_runs": [run["p50"] for run in entry["rtt"]],
        "rtt_cpu": medians(entry["rtt_cpu"]),
    }


#: The demo agent keeps its transcript (for session/load); this one forgets it after each turn.
NO_HISTORY_AGENT = "bench.agent_no_history.create_agent"


async def memory(key: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """RSS with K connections open after long streams, per transport, on a fresh server whose
    agent keeps no transcript."""
    from bench import scenarios
    from bench.client import make_client
    from bench.servers import SERVERS, RssSampler, rss_bytes

    mib = 2**20
    out: dict[str, Any] = {}
    for transport in TRANSPORTS:
        server = SERVERS[key]()
        for proc in server.procs:
            proc.env["ACP_AGENT"] = NO_HISTORY_AGENT
        server.start()
        try:
            warm = make_client(transport, server.url, **server.client_options)
            await warm.open()
            await warm.new_session()
            await scenarios.run_stream(warm, sizes["mem_events"], size=sizes["mem_chunk"])
            await warm.close()
            figures: dict[str, Any] = {"warm_mib": rss_bytes(server.pids()) / mib}
            clients = [make_client(transport, server.url, **server.client_options) for _ in range(sizes["mem_clients"])]
            for client in clients:
                await client.open()
                await client.new_session()
            figures["opened_mib"] = rss_bytes(server.pids()) / mib
            figures["rounds_mib"] = []
            with RssSampler(server.pids()) as sampler:
                for _ in range(sizes["mem_rounds"]):
                    for client in clients:
                        await scenarios.run_stream(client, sizes["mem_events"], size=sizes["mem_chunk"])
                    figures["rounds_mib"].append(rss_bytes(server.pids()) / mib)
            figures["peak_mib"] = sampler.peak / mib
            for client in clients:
                await client.close()
            figures["closed_mib"] = rss_bytes(server.pids()) / mib
            figures["server_errors"] = server.errors()[:5]
            log(f"  {key} {transport}: RSS warm {figures['warm_mib']:.1f} MiB, {len(clients)} open "
                f"{figures['opened_mib']:.1f}, after rounds {', '.join(f'{r:.1f}' for r in figures['rounds_mib'])}, "
                f"closed {figures['closed_mib']:.1f}")  # fmt: skip
            out[transport] = figures
        finally:
            server.stop()
    return out


# -- py-spy --------------------------------------------------------------------------------------

#: (label, function qualname, file, a text on the line to count, or None for the whole function)
PROFILE_TARGETS = [
    ("sse_body (views.py): the SSE write loop, all of it", "sse_body", "acp_channels/_views.py", None),
    ("sse_event (protocol/sse.py): one event's bytes", "sse_event", "acp_channels/_protocol/sse.py", None),
    ("sse_event: the `id:` line", "sse_event", "acp_channels/_protocol/sse.py", 'b"id: "'),
    ("event_id (protocol/sse.py): the id text", "event_id", "acp_channels/_protocol/sse.py", None),
    ("Mailbox.take (host/mailbox.py)", "Mailbox.take", "acp_channels/_host/mailbox.py", None),
    ("Mailbox.settle (host/mailbox.py)", "Mailbox.settle", "acp_channels/_host/mailbox.py", None),
    ("Mailbox._trim_window (host/mailbox.py): forgetting beyond the window", "Mailbox._trim_window",
     "acp_channels/_host/mailbox.py",
     None),
    ("write_outbound (consumers.py): the WebSocket write loop", "write_outbound",
     "acp_channels/_consumers.py", None),
]  # fmt: skip


#: Labels that results files written before a target moved use for it.
EARLIER_LABELS = {"event_id (protocol.py): the id text": "event_id (host.py): the id text"}


def target_share(shares: dict[str, float], label: str) -> float:
    """A target's share in a results file, under its label or the one it had before it moved."""
    return shares.get(label, shares.get(EARLIER_LABELS.get(label, ""), 0.0))


def line_numbers(file: str, text: str | None) -> set[int]:
    if text is None:
        return set()
    lines = (ROOT / file).read_text().splitlines()
    return {number for number, line in enumerate(lines, 1) if text in line}


def shares(collapsed: str) -> dict[str, Any]:
    """Inclusive share of the on-CPU samples per target (a sample counts once per target)."""
    from bench.profile import FRAME

    wanted = [(label, name, file, line_numbers(file, text), text) for label, name, file, text in PROFILE_TARGETS]
    counts = dict.fromkeys((label for label, *_ in wanted), 0)
    total = 0
    for row in collapsed.splitlines():
        stack, _, count_text = row.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [match for frame in stack.split(";") if (match := FRAME.match(frame))]
        for label, name, file, lines, text in wanted:
            for match in frames:
                function, where = match["function"], match["file"]
                if not (function == name or function.endswith("." + name)) or not where.endswith(file):
                    continue
                line = match.group(0).rsplit(":", 1)[-1].rstrip(")")
                if text is None or (line.isdigit() and int(line) in lines):
                    counts[label] += count
                    break
    return {"samples": total, "shares": {label: n / total if total else 0.0 for label, n in counts.items()}}


async def profile(key: str, sizes: dict[str, Any]) -> dict[str, Any]:
    from bench import scenarios
    from bench.client import make_client
    from bench.run import LOADGEN_CPU
    from bench.servers import SERVERS

    spy = Path(sys.executable).with_name("py-spy")
    out: dict[str, Any] = {"server": key, "rate_hz": sizes["profile_rate"]}
    server = SERVERS[key]().start()
    try:
        for transport in TRANSPORTS:
            client = make_client(transport, server.url, **server.client_options)
            await client.open()
            await client.new_session()
            await scenarios.run_stream(client, sizes["warmup"])
            collapsed = HERE / "profiles" / f"resume-{key}-stream-{transport}.collapsed"
            collapsed.parent.mkdir(exist_ok=True)
            collapsed.unlink(missing_ok=True)
            recorder = await asyncio.create_subprocess_exec(
                "taskset", "-c", str(LOADGEN_CPU), str(spy), "record", "--pid", str(server.procs[0].pid), "--rate",
                str(sizes["profile_rate"]), "--format", "raw", "--nonblocking", "--output", str(collapsed),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            await asyncio.sleep(0.5)  # py-spy attaches (nothing to await on)
            rate = [(await scenarios.run_stream(client, sizes["profile_stream"]))["msg_per_s"]
                    for _ in range(sizes["profile_repeat"])]  # fmt: skip
            recorder.send_signal(signal.SIGINT)
            await asyncio.wait_for(recorder.wait(), 30)
            await client.close()
            out[transport] = {**shares(collapsed.read_text() if collapsed.exists() else ""),
                              "msg_per_s_while_sampled": statistics.median(rate)}  # fmt: skip
            top = sorted(out[transport]["shares"].items(), key=lambda item: -item[1])[:4]
            log(f"  {transport}: {out[transport]['samples']} samples; " + ", ".join(f"{v:.1%} {k}" for k, v in top))
    finally:
        server.stop()
    return out


# -- the run -------------------------------------------------------------------------------------


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.run import machine, versions

    keys = FAMILIES[args.family]
    sizes = dict(QUICK if args.quick else FULL)
    from bench.run import LOADGEN_CPU
    from bench.servers import SERVER_CPU

    results: dict[str, Any] = {
        "meta": {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "quick": args.quick,
                 "family": args.family, "variants": dict(zip(keys, ROLE_LABELS, strict=True)), "sizes": sizes,
                 "versions": versions(), "machine": machine(), "load_average_before": loadavg(),
                 "pinning": f"servers on CPU {SERVER_CPU}, load generator on CPU {LOADGEN_CPU}"},
    }  # fmt: skip
    log(f"rates: {', '.join(keys)} at once, {sizes['reps']} turns")
    before = cpu_ticks(SERVER_CPU)
    results["rates"] = await rates(keys, sizes)
    after = cpu_ticks(SERVER_CPU)
    total = (after[2] - before[2]) or 1
    results["rates"]["server_cpu"] = {"busy_share": (after[0] - before[0]) / total,
                                      "steal_share": (after[1] - before[1]) / total}  # fmt: skip
    if not args.no_memory:
        results["memory"] = {"clients": sizes["mem_clients"], "events": sizes["mem_events"],
                             "chunk": sizes["mem_chunk"], "rounds": sizes["mem_rounds"],
                             "window_bytes": WINDOW_BYTES, "window_events": WINDOW_EVENTS, "variants": {}}  # fmt: skip
        for key in keys[:2]:
            log(f"memory: {key}")
            try:
                results["memory"]["variants"][key] = await memory(key, sizes)
            except Exception as error:
                results["memory"]["variants"][key] = {"error": f"{type(error).__name__}: {error}"}
                traceback.print_exc()
    log("micro: encoding and mailbox, in process on the server core")
    results["micro"] = run_micro(sizes)
    log("  " + ", ".join(f"{k} {v:.0f}" for k, v in results["micro"].items() if k.endswith("_ns")))
    if not args.no_profile:
        log(f"profile: {keys[0]} streaming")
        try:
            results["profile"] = await profile(keys[0], sizes)
        except Exception as error:
            results["profile"] = {"error": f"{type(error).__name__}: {error}"}
            traceback.print_exc()
    results["meta"]["load_average_after"] = loadavg()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one repetition")
    parser.add_argument("--family", choices=sorted(FAMILIES), default="daphne")
    parser.add_argument(
        "--out",
        default="",
        help="results file (default bench/resume-cost[-uvicorn].json; another one gets its own .md)",
    )
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--report", action="store_true", help="only render RESUME.md from the results files")
    parser.add_argument("--micro", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.micro:
        events, batch = (int(n) for n in args.micro.split(","))
        print(json.dumps(micro(events, batch)))
        return
    if args.report:
        write_report()
        return
    from bench.run import LOADGEN_CPU, ensure

    ensure("uvloop", "uvloop")
    ensure("orjson", "orjson")
    if not args.no_profile and not Path(sys.executable).with_name("py-spy").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "py-spy"], check=True)
    import uvloop

    os.sched_setaffinity(0, {LOADGEN_CPU})
    os.chdir(ROOT)
    out = Path(args.out) if args.out else RESULTS[args.family]
    started = time.monotonic()
    results = uvloop.run(run(args))
    results["meta"]["duration_s"] = round(time.monotonic() - started)
    out.write_text(json.dumps(results, indent=1))
    log(f"done in {results['meta']['duration_s']} s: {out}")
    if out in RESULTS.values():
        write_report()
    else:  # an experiment's results file: its own report next to it
        write_report([out], out.with_suffix(".md"))


# -- RESUME.md -----------------------------------------------------------------------------------


def ratio(value: float, base: float) -> str:
    return f"{value / base:.3f}" if base else "—"


def summary(results: dict[str, Any]) -> list[str]:
    """The headline figures, each from the results file."""
    keys = list(results["meta"]["variants"])
    shipped, ids_only, base = keys
    variants = results["rates"]["variants"]
    lines = ["In short (ratios to the baseline without ids and window; medians):", ""]
    compared = {  # a WebSocket carries no ids: there only the window differs
        "http": ((shipped, "ids + window"), (ids_only, "ids alone")),
        "ws": ((shipped, "the window (messages numbered on the server, no bytes on the wire)"),),
    }
    for transport in TRANSPORTS:
        parts = []
        for key, what in compared[transport]:
            entry, baseline = variants[key][transport], variants[base][transport]
            parts.append(
                f"{what}: stream {ratio(entry['stream_msg_per_s'], baseline['stream_msg_per_s'])} × the messages/s, "
                f"{ratio(entry['stream_cpu']['us_per_event'], baseline['stream_cpu']['us_per_event'])} × the loop "
                f"CPU per message ({ratio(entry['stream_cpu_best_block'], baseline['stream_cpu_best_block'])} × in "
                f"the best block), rtt p50 {ratio(entry['rtt']['p50'], baseline['rtt']['p50'])} ×"
            )
        lines.append(f"- {TRANSPORT_LABELS[transport]}: " + "; ".join(parts) + ".")
    same, other = variants[ids_only]["ws"], variants[base]["ws"]
    rate = ratio(same["stream_msg_per_s"], other["stream_msg_per_s"])
    cpu = ratio(same["stream_cpu"]["us_per_event"], other["stream_cpu"]["us_per_event"])
    best = ratio(same["stream_cpu_best_block"], other["stream_cpu_best_block"])
    lines.append(
        f"- The noise of the method: over WebSocket `{ids_only}` and `{base}` run the same code (a WebSocket "
        f"carries no ids; both have no window), yet measure {rate} × the messages/s and {cpu} × the loop CPU per "
        f"message ({best} × in the best block) of each other."
    )
    prof, micro = results.get("profile", {}), results.get("micro")
    probe = results["rates"]["probe"]
    if "http" in prof and micro:
        shares = prof["http"]["shares"]
        id_share = shares["sse_event: the `id:` line"] + target_share(shares, "event_id (protocol.py): the id text")
        with_id, without = probe[shipped]["chunk_event_bytes"], probe[base]["chunk_event_bytes"]
        id_ns = micro["encode_with_id_ns"] - micro["encode_without_id_ns"]
        lines.append(
            f"- Where it goes: on HTTP+SSE the `id:` line and `event_id` take {id_share:.1%} of the server's "
            f"on-CPU samples while it streams (py-spy), {id_ns:.0f} ns per event in isolation; each event grows "
            f"from {without} to {with_id} bytes "
            f"({with_id / without - 1:+.1%}). The window: "
            f"{micro['mailbox_window_ns'] - micro['mailbox_no_window_ns']:+.0f} ns per event in isolation "
            f"(`Mailbox._trim_window`, {shares['Mailbox._trim_window (host.py): forgetting beyond the window']:.1%} of "
            "the samples, runs with the window off too: it then forgets each batch once written)."
        )
    mem = results.get("memory", {}).get("variants", {})
    if shipped in mem and ids_only in mem and all(t in mem[k] for k in (shipped, ids_only) for t in TRANSPORTS):
        per_stream = [
            (mem[shipped][t]["rounds_mib"][-1] - mem[shipped][t]["opened_mib"])
            - (mem[ids_only][t]["rounds_mib"][-1] - mem[ids_only][t]["opened_mib"])
            for t in TRANSPORTS
        ]
        clients = results["memory"]["clients"]
        window_mib = results["memory"]["window_bytes"] / 2**20
        moved = [mem[shipped][t]["rounds_mib"][-1] - mem[shipped][t]["rounds_mib"][0] for t in TRANSPORTS]
        # Unbounded, each round would add about what the streams sent (several times the window);
        # flat means well under one window per stream.
        flat = all(abs(m) < 0.25 * clients * window_mib for m in moved)
        lines.append(
            f"- Memory: the window adds {per_stream[0] / clients:.2f} MiB per SSE stream and "
            f"{per_stream[1] / clients:.2f} MiB per WebSocket after long streams (limit {window_mib:.0f} MiB); "
            f"with it, RSS moves {moved[0]:+.1f} MiB ({TRANSPORT_LABELS['http']}) and {moved[1]:+.1f} MiB "
            f"({TRANSPORT_LABELS['ws']}) from the first round to the last: "
            + ("flat, the window is bounded." if flat else "NOT flat: check the window's bound.")
        )
    return [*lines, ""]


def render(results: dict[str, Any]) -> list[str]:
    meta = results["meta"]
    keys = list(meta["variants"])
    base = keys[-1]
    variants = results["rates"]["variants"]
    sizes = meta["sizes"]
    lines = [
        f"## {meta['family']}: {', '.join(f'`{k}`' for k in keys)}",
        "",
        f"{meta['date']}, commit {meta['versions'].get('acp-channels commit', '?')}, {meta['machine']['cpu']} "
        f"({meta['machine']['nproc']} cores), {meta['pinning']}; load average before {meta['load_average_before']}, "
        f"after {meta.get('load_average_after', '?')}; {meta.get('duration_s', '?')} s"
        + (" (--quick)" if meta["quick"] else "")
        + ".",
        "",
        *summary(results),
        "| variant | what | advertised window | SSE chunk event |",
        "|---|---|---|--:|",
    ]
    for key in keys:
        seen = results["rates"]["probe"][key]
        advertised = seen["advertised"] or {}
        window = f"{advertised.get('windowEvents')} events / {advertised.get('windowBytes')} bytes"
        id_line = f"`{seen['id_line']}` + data" if seen["id_line"] else "data only"
        lines.append(
            f"| `{key}` | {meta['variants'][key]} | {window} | {seen['chunk_event_bytes']} bytes ({id_line}) |"
        )
    lines += [
        "",
        f"### Rates (medians of {sizes['reps']}; ratios to `{base}`)",
        "",
        f"Each repetition: per transport, {sizes['blocks']} blocks of *stream* (one prompt `stream "
        f"{sizes['stream_block']} 64`) for each variant, the variants in turns (the first one changing every "
        f"block), then {sizes['blocks']} blocks of {sizes['rtt_block']} sequential echo turns (*rtt*) likewise. "
        "*stream msg/s*: the messages of a repetition's blocks over their time (prompt sent to reply received); "
        "*loop CPU*: the server's event-loop thread's CPU time per message (µs), and per echo turn; *best block*: "
        "the least loop CPU per message of any one stream block (contention only adds CPU time, so this is the "
        "figure least disturbed by the rest of the machine); *wait*: the share of the stream blocks' wall time "
        "that thread was runnable but another process had its core.",
        "",
    ]
    server_cpu = results["rates"].get("server_cpu")
    if server_cpu:
        lines += [
            f"During this phase the server core was busy {server_cpu['busy_share']:.0%} of the time, and the "
            f"hypervisor took it away (steal) {server_cpu['steal_share']:.0%} of the time.",
            "",
        ]
    lines += [
        "| transport | variant | stream msg/s | ratio | loop CPU µs/msg | ratio | Δ µs/msg | best block µs/msg "
        "| ratio | wait | rtt p50 ms | ratio | rtt p99 ms | loop CPU µs/turn | ratio |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for transport in TRANSPORTS:
        baseline = variants[base][transport]
        for key in keys:
            entry = variants[key][transport]
            lines.append(
                f"| {TRANSPORT_LABELS[transport]} | `{key}` | {entry['stream_msg_per_s']:,.0f} "
                f"| {ratio(entry['stream_msg_per_s'], baseline['stream_msg_per_s'])} "
                f"| {entry['stream_cpu']['us_per_event']:.2f} "
                f"| {ratio(entry['stream_cpu']['us_per_event'], baseline['stream_cpu']['us_per_event'])} "
                f"| {entry['stream_cpu']['us_per_event'] - baseline['stream_cpu']['us_per_event']:+.2f} "
                f"| {entry['stream_cpu_best_block']:.2f} "
                f"| {ratio(entry['stream_cpu_best_block'], baseline['stream_cpu_best_block'])} "
                f"| {entry['stream_cpu']['wait_share']:.1%} "
                f"| {entry['rtt']['p50']:.3f} | {ratio(entry['rtt']['p50'], baseline['rtt']['p50'])} "
                f"| {entry['rtt']['p99']:.3f} | {entry['rtt_cpu']['us_per_event']:.0f} "
                f"| {ratio(entry['rtt_cpu']['us_per_event'], baseline['rtt_cpu']['us_per_event'])} |"
            )
    lines += ["", "Each repetition (stream msg/s; loop CPU µs/msg; rtt p50 ms):", ""]
    for transport in TRANSPORTS:
        for key in keys:
            entry = variants[key][transport]
            lines.append(
                f"- {TRANSPORT_LABELS[transport]} `{key}`: "
                + ", ".join(f"{v:,.0f}" for v in entry["stream"])
                + "; "
                + ", ".join(f"{v:.2f}" for v in entry["stream_cpu_runs"])
                + "; "
                + ", ".join(f"{v:.3f}" for v in entry["rtt_p50_runs"])
            )
    micro = results.get("micro")
    if micro:
        lines += [
            "",
            "### Where the cost is: the code that differs, in isolation",
            "",
            f"One process on the server core, {micro['events']:,} demo chunk frames of {micro['frame_chars']} "
            f"characters in batches of {micro['batch']}; the measurements in turns, the best of "
            f"{micro.get('rounds', 7)} rounds, ns per event:",
            "",
            "| code | best | median |",
            "|---|--:|--:|",
        ]
        medians = micro.get("medians", {})

        def row(label: str, name: str) -> str:
            median = medians.get(name)
            return f"| {label} | {micro[name]:.0f} | {'—' if median is None else f'{median:.0f}'} |"

        def difference(label: str, a: str, b: str) -> str:
            median = f"{medians[a] - medians[b]:+.0f}" if a in medians and b in medians else "—"
            return f"| **{label}** | **{micro[a] - micro[b]:+.0f}** | **{median}** |"

        lines += [
            row("SSE encoding of a batch, with `event_id` (as `views.sse_body`)", "encode_with_id_ns"),
            row("the same, `event_id` returning None (`ours-*-noids`)", "encode_without_id_ns"),
            difference("the id: difference", "encode_with_id_ns", "encode_without_id_ns"),
            row("of which `event_id(tag, seq)` alone", "event_id_only_ns"),
            row("mailbox push + take + settle, with the default window", "mailbox_window_ns"),
            row("the same, window 0", "mailbox_no_window_ns"),
            difference("the window: difference", "mailbox_window_ns", "mailbox_no_window_ns"),
        ]
        rows = []
        for transport in TRANSPORTS:
            baseline = variants[base][transport]["stream_cpu"]["us_per_event"]
            measured = [variants[key][transport]["stream_cpu"]["us_per_event"] - baseline for key in keys[:2]]
            rows.append(
                f"{TRANSPORT_LABELS[transport]}: ids + window {measured[0] * 1000:+.0f} ns, "
                f"ids alone {measured[1] * 1000:+.0f} ns"
            )
        lines += [
            "",
            "Measured in the servers above (loop CPU per message against the baseline): " + "; ".join(rows) + ".",
        ]
    prof = results.get("profile")
    if prof and "error" not in prof:
        lines += [
            "",
            f"### Profile: `{prof['server']}` streaming (py-spy {prof['rate_hz']} Hz, inclusive share of the "
            "server's on-CPU samples)",
            "",
            "| function | " + " | ".join(TRANSPORT_LABELS[t] for t in TRANSPORTS if t in prof) + " |",
            "|---|" + "--:|" * sum(1 for t in TRANSPORTS if t in prof),
        ]
        for label, *_ in PROFILE_TARGETS:
            cells = [f"{target_share(prof[t]['shares'], label):.1%}" for t in TRANSPORTS if t in prof]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append(
            "| samples (msg/s while sampled) | "
            + " | ".join(
                f"{prof[t]['samples']} ({prof[t]['msg_per_s_while_sampled']:,.0f})" for t in TRANSPORTS if t in prof
            )
            + " |"
        )
    mem = results.get("memory")
    if mem:
        lines += [
            "",
            f"### Memory of the window: {mem['clients']} connections open, each streaming `stream {mem['events']} "
            f"{mem['chunk']}` per round, {mem['rounds']} rounds",
            "",
            f"RSS of the server (MiB). The window holds at most {mem['window_events']} events and "
            f"{mem['window_bytes'] / 2**20:.0f} MiB per stream: at most "
            f"{mem['clients'] * mem['window_bytes'] / 2**20:.0f} MiB of events for {mem['clients']} streams "
            "(plus Python's object overhead).",
            "",
            "| transport | variant | warm | opened | "
            + " | ".join(f"after round {i + 1}" for i in range(mem["rounds"]))
            + " | peak | after closing | round 1 → last |",
            "|---|---|--:|--:|" + "--:|" * mem["rounds"] + "--:|--:|--:|",
        ]
        memory_keys = list(mem["variants"])
        for transport in TRANSPORTS:
            for key in memory_keys:
                figures = mem["variants"][key].get(transport)
                if not figures:
                    lines.append(
                        f"| {TRANSPORT_LABELS[transport]} | `{key}` | {mem['variants'][key].get('error', '—')} |"
                    )
                    continue
                rounds = figures["rounds_mib"]
                lines.append(
                    f"| {TRANSPORT_LABELS[transport]} | `{key}` "
                    f"| {figures['warm_mib']:.1f} | {figures['opened_mib']:.1f} | "
                    + " | ".join(f"{r:.1f}" for r in rounds)
                    + f" | {figures['peak_mib']:.1f} | {figures['closed_mib']:.1f} | {rounds[-1] - rounds[0]:+.1f} |"
                )
        if len(memory_keys) == 2 and all(t in mem["variants"][k] for k in memory_keys for t in TRANSPORTS):
            on, off = (mem["variants"][k] for k in memory_keys)
            diffs = []
            for transport in TRANSPORTS:
                grown_on = on[transport]["rounds_mib"][-1] - on[transport]["opened_mib"]
                grown_off = off[transport]["rounds_mib"][-1] - off[transport]["opened_mib"]
                diffs.append(
                    f"{TRANSPORT_LABELS[transport]} {grown_on:.1f} MiB with the window, {grown_off:.1f} without "
                    f"(difference {grown_on - grown_off:.1f} MiB, "
                    f"{(grown_on - grown_off) / mem['clients']:.2f} per stream)"
                )
            lines += ["", "Growth from opening to the last round: " + "; ".join(diffs) + "."]
    errors = results["rates"].get("server_errors")
    if errors:
        lines += ["", "Server errors: " + "; ".join(f"`{e.strip()}`" for e in errors)]
    return lines


def write_report(sources: list[Path] | None = None, report: Path = REPORT) -> None:
    """RESUME.md from the results files (default: those of each family that exist)."""
    paths = sources if sources is not None else [path for path in RESULTS.values() if path.exists()]
    lines = [
        "# What resumable streams cost: event ids and the replay window",
        "",
        "Generated by `python -m bench.resume_cost` (`--report` renders again) from "
        + ", ".join(f"`{path.name}`" for path in paths)
        + "; every figure below is from those files. Method: the docstring of `bench/resume_cost.py` "
        "and `bench/README.md`.",
        "",
    ]
    for path in paths:
        lines += [*render(json.loads(path.read_text())), ""]
    report.write_text("\n".join(lines))
    print(f"wrote {report}")


if __name__ == "__main__":
    main()
