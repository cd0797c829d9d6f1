"""The cost of the production settings' middleware on /acp (docs/deployment.md, "What the
middleware costs"): the demo settings against demo_project.settings_production, one daphne worker
each, alternating, three runs each.

    .venv/bin/python -m bench.middleware_cost

Per run: 3,000 sequential POSTs answered 202 on one connection (percentiles after 500 warm-up
ones), then the worker's OS threads with 40 SSE streams open (20 connections, 2 streams each).
Production requests carry `X-Forwarded-Proto: https`, as behind the TLS proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import statistics
import time

import httpx
from tests.live import DaphneServer, initialize, open_sse, post, rpc

POSTS = 3000
WARM_UP = 500
CONNECTIONS = 20
RUNS = 3
VARIANTS = {
    "demo middleware": {},
    "production middleware": {
        "DJANGO_SETTINGS_MODULE": "demo_project.settings_production",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "ACP_ALLOWED_HOSTS": "127.0.0.1",
    },
}


async def run_once(env: dict[str, str]) -> tuple[float, float, int]:
    server = DaphneServer(env={"ACP_AGENT": "tests.wire_agent.create", **env}).start()
    assert server.process is not None
    try:
        async with httpx.AsyncClient(timeout=20, headers={"X-Forwarded-Proto": "https"}) as http:
            connection_id = await initialize(http, server.url)
            seconds = []
            for n in range(POSTS):
                start = time.perf_counter()
                response = await post(http, server.url, rpc(n, "custom/ping"), connection_id)
                seconds.append(time.perf_counter() - start)
                assert response.status_code == 202, response.text
            measured = seconds[WARM_UP:]
            connections = [await initialize(http, server.url) for _ in range(CONNECTIONS)]
            async with contextlib.AsyncExitStack() as streams:
                for each in connections:
                    await streams.enter_async_context(open_sse(http, server.url, each))
                    await streams.enter_async_context(open_sse(http, server.url, each, "s"))
                threads = len(os.listdir(f"/proc/{server.process.pid}/task"))
        return statistics.median(measured) * 1000, statistics.quantiles(measured, n=100)[98] * 1000, threads
    finally:
        server.stop()


async def main() -> None:
    results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in VARIANTS}
    for _ in range(RUNS):
        for name, env in VARIANTS.items():
            results[name].append(await run_once(env))
    for name, runs in results.items():
        p50 = statistics.median(run[0] for run in runs)
        p99 = statistics.median(run[1] for run in runs)
        threads = statistics.median(run[2] for run in runs)
        print(f"{name}: POST 202 p50 {p50:.2f} ms, p99 {p99:.2f} ms; threads with {2 * CONNECTIONS} streams {threads}")


if __name__ == "__main__":
    asyncio.run(main())
