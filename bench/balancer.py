"""The cluster tests' round-robin TCP balancer (tests.cluster.Balancer) as its own process, so
the benchmark can pin it to the server core: `python -m bench.balancer PORT [PORT ...]`.
Prints `LISTENING <port>`. Runs on uvloop when it is installed."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading

with contextlib.suppress(ImportError):
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

from tests.cluster import Balancer


def main() -> None:
    balancer = Balancer([int(port) for port in sys.argv[1:]]).start()
    print(f"LISTENING {balancer.port}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
