"""HTTP/2 against HTTP/1.1 on the same daphne: bench/h2.json and bench/H2.md.

    .venv/bin/python -m bench.h2            # one run (about 2 minutes)
    .venv/bin/python -m bench.h2 --render   # H2.md again from h2.json

Two daphne processes serve the demo agent (bench.servers' pinning: server on CPU 0, this load
generator on CPU 1): one over TLS with a certificate made for the run (`h2` and `http/1.1`
offered through ALPN), one over cleartext TCP. Three modes, the same client code (httpx, the
transport HttpClient uses) with only the protocol changed:

- `h2-tls`: HTTP/2 to the TLS daphne;
- `h1-tls`: HTTP/1.1 to the same TLS daphne (the comparison that isolates HTTP/2);
- `h1-tcp`: HTTP/1.1 to the cleartext daphne (the reference: what `./dev.sh demo` serves).

Scenarios, each on a fresh ACP connection after a warm-up stream of 2,000 messages:

- *stream*: one prompt `stream 20000 64`: messages/s from the prompt to its reply;
- *rtt*: 500 sequential `echo` prompts, prompt POSTed to reply received: p50 and p90;
- *many sessions*: 50 and 200 sessions on one ACP connection: time to create them all and open
  their streams (all at once), then one `stream 20 64` prompt on each at once (messages/s), and
  how many TCP connections the client then holds to the server.

The modes take turns (A/B/C, then rotated) for REPETITIONS rounds because the 2-core machine
is noisy; medians are reported, with ratios to `h1-tls`. The load generator is Python (httpx,
h2): its own cost is part of every number, the same in each mode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "h2.json"
REPORT = HERE / "H2.md"
REPETITIONS = int(os.environ.get("BENCH_H2_REPETITIONS", "3"))
MODES = ["h2-tls", "h1-tls", "h1-tcp"]
STREAM_MESSAGES = 20_000
RTT_TURNS = 500
MANY = [50, 200]
Message = dict[str, Any]


class HttpxAcp:
    """An ACP client over POST + SSE on one httpx client: the connection stream, one stream per
    session, replies matched by id; other messages go to `sink`."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self.http = http
        self.url = url
        self.connection_id = ""
        self._ids = iter(range(1, 1 << 62))
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._readers: list[asyncio.Task[None]] = []
        self.sink: Callable[[Message], None] = lambda message: None
        self.versions: set[str] = set()

    async def open(self) -> None:
        body = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
        response = await self.http.post(self.url, json=body)
        assert response.status_code == 200, response.text
        self.versions.add(response.http_version)
        self.connection_id = response.headers["acp-connection-id"]
        await self._open_stream(None)

    async def _open_stream(self, session: str | None) -> None:
        headers = {"Accept": "text/event-stream", "Acp-Connection-Id": self.connection_id}
        if session is not None:
            headers["Acp-Session-Id"] = session
        request = self.http.build_request("GET", self.url, headers=headers, timeout=httpx.Timeout(30.0, read=None))
        response = await self.http.send(request, stream=True)
        assert response.status_code == 200, response.status_code
        self.versions.add(response.http_version)
        self._readers.append(asyncio.create_task(self._read(response)))

    async def _read(self, response: httpx.Response) -> None:
        buffer = b""
        try:
            async for chunk in response.aiter_bytes():
                buffer += chunk
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    for line in event.split(b"\n"):
                        if line.startswith(b"data:"):
                            self._deliver(json.loads(line[5:]))
        finally:
            await response.aclose()

    def _deliver(self, message: Message) -> None:
        if "method" not in message:
            future = self._pending.pop(message.get("id"), None)  # type: ignore[arg-type]
            if future is not None and not future.done():
                future.set_result(message)
                return
        self.sink(message)

    async def post(self, message: Message, session: str | None = None) -> None:
        headers = {"Acp-Connection-Id": self.connection_id}
        if session is not None:
            headers["Acp-Session-Id"] = session
        response = await self.http.post(self.url, headers=headers, json=message)
        assert response.status_code == 202, response.text
        self.versions.add(response.http_version)

    async def call(self, method: str, params: Any, session: str | None = None) -> Message:
        request_id = next(self._ids)
        future = self._pending[request_id] = asyncio.get_running_loop().create_future()
        await self.post({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}, session)
        reply = await asyncio.wait_for(future, 60)
        assert "result" in reply, reply
        return reply

    async def new_session(self) -> str:
        reply = await self.call("session/new", {"cwd": "/tmp", "mcpServers": []})
        session: str = reply["result"]["sessionId"]
        await self._open_stream(session)
        return session

    async def prompt(self, session: str, text: str) -> Message:
        params = {"sessionId": session, "prompt": [{"type": "text", "text": text}]}
        return await self.call("session/prompt", params, session)

    async def close(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self.http.delete(self.url, headers={"Acp-Connection-Id": self.connection_id})
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)


def chunk_counter(client: HttpxAcp) -> Callable[[], int]:
    """Counts the agent_message_chunk updates the sink receives."""
    count = 0

    def sink(message: Message) -> None:
        nonlocal count
        if message.get("method") == "session/update":
            count += 1

    client.sink = sink
    return lambda: count


def established_connections(port: int) -> int:
    """The server's established TCP connections (its side: local port `port`), from /proc."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    count += 1
    return count


def http_client(mode: str, cafile: str) -> httpx.AsyncClient:
    from acp_channels.client._h2_transport import fair_h2_transport

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    context = ssl.create_default_context(cafile=cafile)
    transport = (
        fair_h2_transport(http2=True, verify=context, limits=limits)
        if mode == "h2-tls"
        else httpx.AsyncHTTPTransport(verify=context, limits=limits)
    )
    return httpx.AsyncClient(
        transport=transport, timeout=httpx.Timeout(60.0), headers={"Content-Type": "application/json"}
    )


async def run_mode(mode: str, url: str, port: int, cafile: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    async with http_client(mode, cafile) as http:
        client = HttpxAcp(http, url)
        await client.open()
        session = await client.new_session()
        received = chunk_counter(client)
        await client.prompt(session, "stream 2000 64")  # warm-up

        before = received()
        started = time.perf_counter()
        await client.prompt(session, f"stream {STREAM_MESSAGES} 64")
        elapsed = time.perf_counter() - started
        await asyncio.sleep(0)  # chunks filed before the reply (one read) are counted
        assert received() - before == STREAM_MESSAGES, (received() - before, STREAM_MESSAGES)
        result["stream_msgs_per_s"] = STREAM_MESSAGES / elapsed

        rtts = []
        for turn in range(RTT_TURNS):
            started = time.perf_counter()
            await client.prompt(session, f"echo r{turn}")
            rtts.append(time.perf_counter() - started)
        result["rtt_p50_ms"] = statistics.median(rtts) * 1000
        result["rtt_p90_ms"] = statistics.quantiles(rtts, n=10)[-1] * 1000
        await client.close()
        result["versions"] = sorted(client.versions)

    for sessions in MANY:
        async with http_client(mode, cafile) as http:
            client = HttpxAcp(http, url)
            await client.open()
            received = chunk_counter(client)
            started = time.perf_counter()
            ids = await asyncio.gather(*(client.new_session() for _ in range(sessions)))
            result[f"many{sessions}_open_s"] = time.perf_counter() - started
            before = received()
            started = time.perf_counter()
            await asyncio.gather(*(client.prompt(session, "stream 20 64") for session in ids))
            elapsed = time.perf_counter() - started
            await asyncio.sleep(0)
            assert received() - before == 20 * sessions, (received() - before, 20 * sessions)
            result[f"many{sessions}_msgs_per_s"] = 20 * sessions / elapsed
            result[f"many{sessions}_tcp_connections"] = established_connections(port)
            await client.close()
    return result


def start_servers(cert: Any) -> dict[str, Any]:
    from bench.servers import DAPHNE_READY, MAX_MESSAGE, Proc

    common = ["--websocket-max-message-size", MAX_MESSAGE, "--websocket-max-frame-size", MAX_MESSAGE]
    tls_endpoint = f"ssl:port=0:interface=127.0.0.1:backlog=2048:privateKey={cert.key}:certKey={cert.cert}"
    # 200 session streams on one connection: over the default cap of session streams.
    env = {"ACP_SHUTDOWN_GRACE_SECONDS": "1", "ACP_MAX_SESSION_STREAMS": "256"}
    app = "demo_project.asgi:application"
    tls = Proc("daphne-tls", [sys.executable, "-m", "daphne", "-e", tls_endpoint, *common, app], DAPHNE_READY, env)
    tcp_endpoint = "tcp:port=0:interface=127.0.0.1:backlog=2048"
    tcp = Proc("daphne-tcp", [sys.executable, "-m", "daphne", "-e", tcp_endpoint, *common, app], DAPHNE_READY, env)
    return {"tls": tls.start(), "tcp": tcp.start()}


async def run_all() -> dict[str, Any]:
    from demo_project.devcert import write_certificate

    from bench.cluster_hop import commit_of

    with contextlib.suppress(OSError):  # the load generator on its own core, as bench.run
        os.sched_setaffinity(0, {int(os.environ.get("BENCH_LOADGEN_CPU", "1"))})
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="acp-bench-cert-") as directory:
        cert = write_certificate(Path(directory))
        servers = start_servers(cert)
        rounds: list[dict[str, Any]] = []
        try:
            for repetition in range(REPETITIONS):
                order = MODES[repetition % len(MODES) :] + MODES[: repetition % len(MODES)]
                for mode in order:
                    server = servers["tcp" if mode == "h1-tcp" else "tls"]
                    scheme = "http" if mode == "h1-tcp" else "https"
                    url = f"{scheme}://127.0.0.1:{server.port}/acp"
                    measured = await run_mode(mode, url, server.port, str(cert.cert))
                    rounds.append({"mode": mode, "repetition": repetition, **measured})
                    shown = {k: round(v, 2) if isinstance(v, float) else v for k, v in measured.items()}
                    print(mode, repetition, shown, flush=True)
        finally:
            for server in servers.values():
                server.stop()
        errors = [line for server in servers.values() for line in server.errors()]
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit_of(HERE.parent),
        "seconds": round(time.monotonic() - started),
        "repetitions": REPETITIONS,
        "rounds": rounds,
        "server_errors": errors[:20],
    }


ROWS = [
    ("stream_msgs_per_s", "stream: messages/s (one prompt, 20,000 chunks)", "{:,.0f}", True),
    ("rtt_p50_ms", "rtt p50, ms (500 echo prompts)", "{:.2f}", False),
    ("rtt_p90_ms", "rtt p90, ms", "{:.2f}", False),
    *[
        row
        for sessions in MANY
        for row in (
            (f"many{sessions}_open_s", f"{sessions} sessions on one ACP connection: create + open streams, s",
             "{:.2f}", False),
            (f"many{sessions}_msgs_per_s", f"{sessions} sessions: messages/s, one `stream 20 64` each at once",
             "{:,.0f}", True),
            (f"many{sessions}_tcp_connections", f"{sessions} sessions: TCP connections to the server", "{:.0f}", None),
        )
    ],
]  # fmt: skip


def medians(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    table: dict[str, dict[str, float]] = {}
    for mode in MODES:
        rounds = [entry for entry in results["rounds"] if entry["mode"] == mode]
        table[mode] = {key: statistics.median(entry[key] for entry in rounds) for key, *_ in ROWS}
    return table


def render(results: dict[str, Any]) -> str:
    table = medians(results)
    lines = [
        "# HTTP/2 against HTTP/1.1 on the same daphne",
        "",
        f"`python -m bench.h2` on {results['commit']}, {results['date']}, {results['seconds']} s; medians of "
        f"{results['repetitions']} interleaved rounds. Method: the docstring of [h2.py](h2.py). Server pinned to "
        "one core, the load generator (httpx and h2, in Python) to the other; compare the columns with each "
        "other, not with RESULTS.md (another client).",
        "",
        "| | h2-tls | h1-tls | h1-tcp | h2-tls / h1-tls |",
        "|---|--:|--:|--:|--:|",
    ]
    for key, label, fmt, with_ratio in ROWS:
        values = [fmt.format(table[mode][key]) for mode in MODES]
        ratio = "" if with_ratio is None else f"{table['h2-tls'][key] / table['h1-tls'][key]:.2f}x"
        lines.append(f"| {label} | {' | '.join(values)} | {ratio} |")
    versions = {
        mode: sorted({v for e in results["rounds"] if e["mode"] == mode for v in e["versions"]}) for mode in MODES
    }
    lines += [
        "",
        "TCP connections over HTTP/2: daphne allows 100 streams at once per connection, and the sessions are "
        "created all at once, so the session streams and the session/new POSTs in flight together pass 100 "
        "(50 sessions: 51 streams and up to 50 POSTs); the client then opens another connection. Over "
        "HTTP/1.1 each stream and each concurrent POST holds one.",
        "",
        "Protocols the client saw: " + "; ".join(f"{mode} {', '.join(v)}" for mode, v in versions.items()) + ".",
        "Server errors in the logs: "
        + (str(len(results["server_errors"])) if results["server_errors"] else "none")
        + ".",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--render", action="store_true", help="rewrite H2.md from h2.json")
    args = parser.parse_args()
    if args.render:
        results = json.loads(RESULTS.read_text())
    else:
        results = asyncio.run(run_all())
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    REPORT.write_text(render(results))
    print(REPORT.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
