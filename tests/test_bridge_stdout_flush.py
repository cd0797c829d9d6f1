"""The bridge's last lines reach an editor that reads its stdout more slowly than it writes.

What the bridge writes just before it exits (here: the errors answering the requests still
pending when stdin closed) may still sit in its stdout pipe transport's buffer when it closes:
up to the high-water mark, which drain() does not wait below. It must wait for the editor to take
them instead of exiting with them unsent (it lost a few hundred of these answers before).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import websockets
from websockets.asyncio.server import ServerConnection

from tests import forked

ROOT = Path(__file__).resolve().parent.parent
#: Enough answers (about 700 KiB) that the bridge writes them faster than the editor reads: its
#: stdout transport still holds up to its high-water mark (64 KiB) of them when it closes.
PENDING = 5000


async def _swallow(socket: ServerConnection) -> None:
    async for _ in socket:  # a remote that never answers
        pass


async def test_answers_written_at_exit_reach_an_editor_reading_late() -> None:
    async with websockets.serve(_swallow, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        bridge = await forked.create_subprocess_exec(
            sys.executable, "-m", "acp_channels.bridge", "--drain-timeout", "0", f"ws://127.0.0.1:{port}/acp",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=ROOT,
        )  # fmt: skip
        assert bridge.stdin is not None and bridge.stdout is not None
        requests = (json.dumps({"jsonrpc": "2.0", "id": n, "method": "x/never"}) for n in range(PENDING))
        bridge.stdin.write("".join(f"{line}\n" for line in requests).encode())
        bridge.stdin.close()
        async with asyncio.timeout(60):
            output = b""
            while piece := await bridge.stdout.read(4096):
                output += piece
                await asyncio.sleep(0.002)  # an editor busy elsewhere reads a little at a time
            status = await bridge.wait()
    answers = [json.loads(line) for line in output.splitlines()]
    assert status == 0
    assert sorted(answer["id"] for answer in answers) == list(range(PENDING))
    assert {answer["error"]["data"]["acpBridge"] for answer in answers} == {"stdin-closed"}
