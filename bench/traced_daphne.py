"""daphne with tracemalloc on, for bench.memory's breakdown: `python -m bench.traced_daphne
DAPHNE-ARGS...`; each SIGUSR1 writes a snapshot to `$BENCH_TRACE_OUT.<n>` (after a collection)
and prints `TRACED <n>` once it is on disk. A benchmark tool, never used by the package."""

from __future__ import annotations

import gc
import os
import signal
import sys
import tracemalloc

FRAMES = 10


def main() -> None:
    tracemalloc.start(FRAMES)
    written = 0

    def snapshot(*_: object) -> None:
        nonlocal written
        gc.collect()
        written += 1
        tracemalloc.take_snapshot().dump(f"{os.environ['BENCH_TRACE_OUT']}.{written}")
        print(f"TRACED {written}", flush=True)

    signal.signal(signal.SIGUSR1, snapshot)
    from daphne.cli import CommandLineInterface

    sys.argv = ["daphne", *sys.argv[1:]]
    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
