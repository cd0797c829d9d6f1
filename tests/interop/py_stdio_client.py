#!/usr/bin/env python3
"""Interop driver: the official ACP Python SDK client (``agent-client-protocol`` 0.12.1) as an
editor runs a stdio agent: ``acp.spawn_agent_process`` starts ``CMD ARGS...`` and speaks
newline-delimited JSON-RPC on its stdin/stdout; the child's stderr passes through.

Usage::

    python tests/interop/py_stdio_client.py [--timeout SECONDS] [--] CMD [ARGS...]
    python tests/interop/py_stdio_client.py -- .venv/bin/python -m demo_project.agent
    python tests/interop/py_stdio_client.py -- .venv/bin/python -m acp_channels.bridge http://127.0.0.1:8000/acp

The child gets this process's environment and working directory, and must behave as the demo
agent (see README.md). The scenario (steps shared with py_client.py): initialize
(fs.readTextFile) -> session/new -> ``stream 50 64`` -> ``tool_calls`` -> ``permission`` (answers
``allow``) -> ``fs_read <path>`` (answered from memory) -> ``wait_for_cancel`` + session/cancel
-> a second session/new, ``echo second`` there, ``echo first`` in the first -> close: end the
child's stdin and wait for it to exit, with status 0.

Prints exactly one JSON line on stdout summarising what it observed. Exit status: 0 when every
check passed, 1 when one failed (the JSON line has ``"ok": false`` and ``"error"``), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from importlib.metadata import version
from typing import Any

from acp import spawn_agent_process
from py_client import (
    CheckFailed,
    Run,
    ScenarioClient,
    WireLog,
    cancel_step,
    echo_step,
    fs_read_step,
    initialize,
    new_session,
    permission_step,
    require,
    step,
    stream_step,
    tool_calls_step,
)

#: How long a child that failed the run gets to exit on stdin EOF, then after SIGTERM (the SDK's
#: own shutdown when its context ends).
GRACE_SECONDS = 5.0


async def scenario(run: Run) -> None:
    await initialize(run, read_text_file=True)
    session_id = await new_session(run, "session/new")
    run.summary["session"] = True
    await stream_step(run, session_id)
    await tool_calls_step(run, session_id)
    await permission_step(run, session_id)
    await fs_read_step(run, session_id)
    await cancel_step(run, session_id)

    # a second session on the same connection; the first one still answers
    second = await new_session(run, "session/new (second)")
    require(second != session_id, "session/new (second): the first session's id again")
    run.summary["second"] = await echo_step(run, second, "second")
    run.summary["first"] = await echo_step(run, session_id, "first")
    run.summary["sessions"] = 2


async def run_agent(argv: list[str], seconds: float, summary: dict[str, Any]) -> None:
    client = ScenarioClient()
    wire = WireLog()
    spawned = spawn_agent_process(
        client,
        argv[0],
        *argv[1:],
        env=os.environ,  # all of it (the SDK passes a trimmed environment by default)
        transport_kwargs={"stderr": None, "shutdown_timeout": GRACE_SECONDS},  # stderr passes through
        use_unstable_protocol=True,
        observers=[wire],
    )
    spawned_process: asyncio.subprocess.Process | None = None
    try:
        async with spawned as (conn, process):
            spawned_process = process
            run = Run(conn, client, wire, seconds, summary)
            # A child that exits early fails the step in progress at once, with its status.
            scenario_task = asyncio.ensure_future(scenario(run))
            exit_task = asyncio.ensure_future(process.wait())
            try:
                await asyncio.wait({scenario_task, exit_task}, return_when=asyncio.FIRST_COMPLETED)
                if not scenario_task.done():
                    raise CheckFailed(f"the agent exited during the scenario with status {process.returncode}")
                scenario_task.result()
            finally:
                scenario_task.cancel()
                summary["sent"] = wire.sent_methods()
                summary["responsesSent"] = wire.responses_sent()

            # close: EOF on the child's stdin; it must exit by itself, with status 0
            closing = time.monotonic()
            assert process.stdin is not None
            process.stdin.write_eof()
            summary["exited"] = False
            code = await step("close: the agent's exit after stdin EOF", asyncio.shield(exit_task), seconds)
            summary["exitMs"] = round((time.monotonic() - closing) * 1000)
            summary["exited"] = True
            summary["exitCode"] = code
            require(code == 0, f"close: the agent exited with status {code}, expected 0")
            summary["closed"] = True
    finally:
        if spawned_process is not None:
            summary.setdefault("exitCode", spawned_process.returncode)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=20.0, help="per-step timeout, seconds (20)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the agent command and its arguments")
    args = parser.parse_args()
    argv = args.command[1:] if args.command[:1] == ["--"] else args.command
    summary: dict[str, Any] = {
        "ok": False,
        "client": "python-sdk",
        "sdk": version("agent-client-protocol"),
        "transport": "stdio",
        "command": argv,
    }
    if not argv or args.timeout <= 0:
        summary["error"] = "usage: py_stdio_client.py [--timeout SECONDS] [--] CMD [ARGS...]"
        print(json.dumps(summary), flush=True)
        print(f"py_stdio_client: {summary['error']}", file=sys.stderr)
        return 2
    try:
        asyncio.run(run_agent(argv, args.timeout, summary))
        summary["ok"] = True
    except CheckFailed as exc:
        summary["error"] = str(exc)
    except Exception as exc:  # any failure, e.g. a JSON-RPC error, becomes the one JSON line
        summary["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(summary), flush=True)
    if not summary["ok"]:
        print(f"py_stdio_client: FAILED: {summary['error']}", file=sys.stderr)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
