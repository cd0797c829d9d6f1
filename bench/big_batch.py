"""One big JSON-RPC batch against a running server, and how long another client waits meanwhile.

    python -m bench.big_batch http://127.0.0.1:8000/acp [--entries 200000] [--method session/list]

Client A initializes, opens its connection stream and POSTs one batch of `entries` requests;
client B initializes and DELETEs over and over until A's grouped reply arrives. Prints the
time to A's 202, the time to its grouped reply (the batch's duration), and the latencies of B's
requests (initialize and DELETE) while the batch was processed. A server whose batch limit is below `entries` answers
the batch with a -32600 on A's stream: that time is printed instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from typing import Any

import httpx
import orjson

JSON = {"Content-Type": "application/json"}


async def initialize(client: httpx.AsyncClient, url: str) -> str:
    body = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
    response = await client.post(url, headers=JSON, json=body)
    response.raise_for_status()
    return response.headers["acp-connection-id"]


async def first_event(response: httpx.Response) -> Any:
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line == "" and data:
            return json.loads("\n".join(data))
    raise RuntimeError("the stream ended")


async def run(url: str, entries: int, method: str, other_client: bool = True) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    body = orjson.dumps([{"jsonrpc": "2.0", "id": index, "method": method, "params": {}} for index in range(entries)])
    timeout = httpx.Timeout(600.0)
    async with httpx.AsyncClient(timeout=timeout) as a, httpx.AsyncClient(timeout=timeout) as b:
        idle = []
        for _ in range(5):
            sent = loop.time()
            connection = await initialize(b, url)
            idle.append(loop.time() - sent)
            await b.delete(url, headers={"Acp-Connection-Id": connection})
        connection_id = await initialize(a, url)
        headers = {"Accept": "text/event-stream", "Acp-Connection-Id": connection_id}
        async with a.stream("GET", url, headers=headers) as stream:
            started = loop.time()
            accepted_at: list[float] = []

            async def post() -> int:
                response = await a.post(url, headers={**JSON, "Acp-Connection-Id": connection_id}, content=body)
                accepted_at.append(loop.time() - started)
                return response.status_code

            posting = asyncio.create_task(post())
            reply_task = asyncio.create_task(first_event(stream))
            latencies: list[float] = []  # B's requests answered before the grouped reply
            overlapping: list[float] = []  # and those answered after it
            while other_client and not reply_task.done():
                sent = loop.time()
                connecting = asyncio.create_task(initialize(b, url))
                await asyncio.wait({connecting, reply_task}, return_when=asyncio.FIRST_COMPLETED)
                answered_first = not reply_task.done()
                other = await connecting
                (latencies if answered_first else overlapping).append(loop.time() - sent)
                sent = loop.time()
                deleting = asyncio.create_task(b.delete(url, headers={"Acp-Connection-Id": other}))
                await asyncio.wait({deleting, reply_task}, return_when=asyncio.FIRST_COMPLETED)
                answered_first = not reply_task.done()
                await deleting
                (latencies if answered_first else overlapping).append(loop.time() - sent)
            reply = await reply_task
            duration = loop.time() - started
            status = await posting
        await a.delete(url, headers={"Acp-Connection-Id": connection_id})
    refused = isinstance(reply, dict) and reply.get("error", {}).get("code") == -32600
    return {
        "entries": entries,
        "post_status": status,
        "seconds_to_202": round(accepted_at[0], 3),
        "seconds_to_reply": round(duration, 3),
        "reply": reply if refused else f"array of {len(reply)}",
        "idle_initialize_ms": round(1000 * statistics.median(idle), 1),
        "requests_during_batch": len(latencies),
        "request_ms_median": round(1000 * statistics.median(latencies), 1) if latencies else None,
        "request_ms_max": round(1000 * max(latencies), 1) if latencies else None,
        "max_request_over_batch": round(max(latencies) / duration, 3) if latencies else None,
        "overlapping_request_ms": [round(1000 * latency, 1) for latency in overlapping],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--method", default="session/list")
    parser.add_argument("--alone", action="store_true", help="no other client: the batch's own duration")
    arguments = parser.parse_args()
    result = asyncio.run(run(arguments.url, arguments.entries, arguments.method, not arguments.alone))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
