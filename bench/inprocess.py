"""In-process baselines: the same scenarios with no HTTP and no sockets, agent and client in one
process (run it pinned to one core).

    python -m bench.inprocess sdk  [--quick]   # the Python SDK agent (demo agent) through memory
    python -m bench.inprocess host [--quick]   # the same agent behind our ConnectionHost + SDK adapter

`sdk` is the in-process limit: `AgentSideConnection` on `acp._transport.memory_transport_pair()`,
exactly as the official Python SDK server binds its agent, with the client reading the message
dicts straight from the other end (no serialization). `host` adds what acp_channels does per
message before any server is involved: the SdkAgentChannel adapter (id mapping, batches), the
host's routing, JSON serialization and the per-stream mailboxes; frames go in as the views pass
them (`protocol.parse_frame` + `plan_inbound`) and come out as the text an SSE view would write.
Prints one JSON object with the results.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from typing import Any

import orjson

from bench import scenarios
from bench.client import INIT_PARAMS, AcpClient, Message, ProtocolError


class SdkMemoryClient(AcpClient):
    transport = "memory"

    async def open(self) -> None:
        from acp._transport import memory_transport_pair
        from acp.agent.connection import AgentSideConnection
        from demo_project.agent import create_agent

        agent_side, self._side = memory_transport_pair()
        self._connection = AgentSideConnection(lambda conn: create_agent(), agent_side, listening=True)
        self._pump = asyncio.ensure_future(self._read())
        reply = await self.call("initialize", INIT_PARAMS)
        if "result" not in reply:
            raise ProtocolError(f"initialize: {reply}")

    async def _read(self) -> None:
        while (message := await self._side.receive()) is not None:
            self._one(message)

    async def new_session(self) -> str:
        reply = await self.call("session/new", {"cwd": "/tmp", "mcpServers": []})
        self.session_id = reply["result"]["sessionId"]
        return self.session_id

    async def send(self, message: Message, session: str | None = None) -> None:
        await self._side.send(message)

    async def close(self) -> None:
        self._pump.cancel()
        await self._side.close()


class HostMemoryClient(AcpClient):
    transport = "memory"

    async def open(self) -> None:
        from acp_channels import _protocol as protocol
        from acp_channels._agents.sdk import SdkAgentChannel
        from acp_channels._host import ConnectionHost
        from demo_project.agent import create_agent

        self._protocol = protocol
        self.host = ConnectionHost(
            "bench",
            SdkAgentChannel(create_agent()),
            "http",
            max_buffered_bytes=64 * 1024 * 1024,
            on_end=lambda host: None,
        )
        text = orjson.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT_PARAMS}).decode()
        reply = await self.host.initialize(protocol.parse_frame(text), 0)
        if not reply.accepted:
            raise ProtocolError(f"initialize: {reply.body}")
        self._readers = [asyncio.ensure_future(self._read(None))]

    async def _read(self, key: str | None) -> None:
        lease = self.host.lease(key)
        try:
            while (items := await lease.take(None)) is not None:
                for item in items:
                    self._deliver(item)  # the text an SSE view would frame
        finally:
            lease.release()

    async def new_session(self) -> str:
        reply = await self.call("session/new", {"cwd": "/tmp", "mcpServers": []})
        self.session_id = reply["result"]["sessionId"]
        self._readers.append(asyncio.ensure_future(self._read(self.session_id)))
        return self.session_id

    async def send(self, message: Message, session: str | None = None) -> None:
        frame = self._protocol.parse_frame(orjson.dumps(message).decode())
        await self.host.submit(self._protocol.plan_inbound(frame, session))

    async def close(self) -> None:
        await self.host.terminate()
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)


async def measure(mode: str, sizes: dict[str, int]) -> dict[str, Any]:
    client: AcpClient = SdkMemoryClient("memory") if mode == "sdk" else HostMemoryClient("memory")
    await client.open()
    await client.new_session()
    await scenarios.run_stream(client, sizes["warmup"])
    result: dict[str, Any] = {"stream": [], "rtt": [], "permission": []}
    for _ in range(sizes["reps"]):
        result["stream"].append((await scenarios.run_stream(client, sizes["stream"]))["msg_per_s"])
        result["rtt"].append(await scenarios.run_rtt(client, sizes["rtt"]))
        result["permission"].append(await scenarios.run_permission(client, sizes["permission"]))
    with contextlib.suppress(Exception):
        await client.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["sdk", "host"])
    parser.add_argument("--sizes", default="{}", help="JSON: warmup, stream, rtt, permission, reps")
    args = parser.parse_args()
    sizes = {"warmup": 20000, "stream": 20000, "rtt": 2000, "permission": 200, "reps": 3, **json.loads(args.sizes)}
    if args.mode == "host":
        import django

        django.setup()
    try:
        import uvloop

        result = uvloop.run(measure(args.mode, sizes))
    except ImportError:
        result = asyncio.run(measure(args.mode, sizes))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
