"""A server that does nothing but send: the load generator's own ceiling.

    python -m bench.rawserver           # prints LISTENING <port>

`GET /?n=N` (Accept: text/event-stream) answers an SSE stream of N prebuilt ACP
`agent_message_chunk` notifications (64-character texts, one HTTP chunk per event, the costliest
framing for the reader) and then the prompt reply `{"id":1,...}`; a WebSocket upgrade to the same
URL sends the same messages as text frames. Nothing is computed per request but the bytes, so
the reading side (bench.wire + bench.client + the scenario's checks) is what is measured.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import sys
from functools import lru_cache
from urllib.parse import parse_qs, urlsplit

with contextlib.suppress(ImportError):
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def messages(count: int) -> list[bytes]:
    width = len(str(max(count - 1, 0)))
    out = []
    for index in range(count):
        label = f"{index:0{width}d}:"
        text = label + "x" * (64 - len(label))
        out.append(
            b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess-raw","update":'
            b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"' + text.encode() + b'"}}}}'
        )
    out.append(b'{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}')
    return out


@lru_cache(maxsize=4)
def sse_body(count: int) -> bytes:
    parts = []
    for message in messages(count):
        event = b"data: " + message + b"\n\n"
        parts.append(b"%x\r\n%s\r\n" % (len(event), event))
    parts.append(b"0\r\n\r\n")
    return b"".join(parts)


@lru_cache(maxsize=4)
def ws_body(count: int) -> bytes:
    parts = []
    for message in messages(count):
        size = len(message)
        head = bytes([0x81, size]) if size < 126 else bytes([0x81, 126]) + size.to_bytes(2, "big")
        parts.append(head + message)
    return b"".join(parts)


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        target = head[0].split(" ")[1]
        count = int(parse_qs(urlsplit(target).query).get("n", ["20000"])[0])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
        if headers.get("upgrade", "").lower() == "websocket":
            accept = base64.b64encode(hashlib.sha1(headers["sec-websocket-key"].encode() + WS_GUID).digest())
            writer.write(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
            )
            writer.write(ws_body(count))
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(sse_body(count))
        await writer.drain()
        await reader.read()  # until the client closes
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    server = await asyncio.start_server(serve, "127.0.0.1", port, backlog=2048)
    print(f"LISTENING {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
