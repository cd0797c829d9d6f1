"""A frame-level scripted agent for the wire tests (ACP_AGENT=tests.wire_agent.create).

It speaks raw frames (an AgentChannel), so tests can make it do what an SDK agent would not:
send side traffic before the init reply, emit malformed output, exit, burst, and report exactly
which frames it received (method `test/received`).

Requests it understands (everything else is echoed: result {"method": m, "params": p}):
- initialize: params.reject -> error reply; params.sideTraffic -> a `test/side` notification
  (and one for session "side-session") before the reply; params.hang -> never replies;
  params.exit -> ends without replying.
- test/received: result {"frames": [every frame received before this one, as JSON text]}.
- test/emit: params.frames (list of raw texts) are emitted as they are (malformed allowed).
- test/burst: params.count notifications `test/item` {"n": i, "sessionId"?} then the reply.
- test/ask: sends the client a request {"id": params.askId, "method": "test/question",
  "params": {"sessionId"?}} then replies.
- test/exit: replies, emits params.final (a notification) if given, then ends.
- test/block_loop: blocks the worker's event loop for params.seconds (an overloaded worker).
- test/block_input: replies, then stops taking input: every later send() waits (backpressure).
- test/break_input: replies, then every later send() raises RuntimeError (an adapter bug: an
  error the host does not expect).
- test/flood: replies, then emits params.count notifications `test/flooded` {"n": i, "pad":
  params.size characters}, each only once the host has taken all but a few of the earlier ones
  (the agent itself holds next to nothing: whatever grows is the server's).
- test/flood_stats: result {"taken": how many `test/flooded` frames the hosts of this process
  have taken from their agents so far} (a module-level count, readable from any connection).
- test/threads_started: result {"started": how many Python threads this process has started
  since this module was imported} (any connection).
A batch gets one grouped reply array of echoes (malformed call entries get -32600 slots);
notification-only batches get nothing; malformed frames get the SDK-style -32700/-32600.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

from acp_channels import _protocol as protocol
from acp_channels._agents import AgentClosed
from acp_channels._protocol import Batch, Frame, Malformed, MalformedEntry, Message, Single

#: `test/flooded` frames taken by hosts from wire agents in this process (see test/flood_stats).
flood_frames_taken = 0
#: A flooding agent emits its next frame only while fewer than this many wait to be taken.
FLOOD_QUEUED_FRAMES = 4

#: Python threads started in this process since import (test/threads_started): counted in the
#: process itself, as other processes (a parallel test run) start threads of their own.
threads_started = 0
_threads_started_lock = threading.Lock()
_start_thread = threading.Thread.start


def _counted_start(thread: threading.Thread) -> None:
    global threads_started
    with _threads_started_lock:
        threads_started += 1
    _start_thread(thread)


threading.Thread.start = _counted_start  # type: ignore[method-assign]


class WireAgent:
    def __init__(self) -> None:
        self._outbox: asyncio.Queue[Frame | None] = asyncio.Queue()
        self._received: list[str] = []
        self._closed = False
        self._input_open = asyncio.Event()
        self._input_open.set()
        self._frame_taken = asyncio.Event()
        self._input_broken = False
        self._flood: asyncio.Task[None] | None = None

    async def send(self, frame: Frame) -> None:
        await self._input_open.wait()
        if self._input_broken:
            raise RuntimeError("the wire agent's input is broken (test/break_input)")
        if self._closed:
            raise AgentClosed("wire agent ended")
        if isinstance(frame, Single) and frame.message.get("method") == "test/received":
            self._reply(frame.message, {"frames": list(self._received)})
            return
        self._received.append(protocol.serialize_frame(frame))
        if isinstance(frame, Malformed):
            if not _response_shaped_text(frame.raw):
                self._emit(Single(frame.error))
        elif isinstance(frame, Batch):
            replies = [_batch_reply(entry) for entry in frame.entries]
            present = [reply for reply in replies if reply is not None]
            if present:
                self._emit(Batch(present))
        else:
            self._handle(frame.message)

    async def receive(self) -> Frame | None:
        global flood_frames_taken
        frame = await self._outbox.get()
        self._frame_taken.set()
        if isinstance(frame, Single) and frame.message.get("method") == "test/flooded":
            flood_frames_taken += 1
        return frame

    async def close(self) -> None:
        if self._flood is not None:
            self._flood.cancel()
        self._end()

    # -- behaviour ---------------------------------------------------------------------------

    def _handle(self, message: Message) -> None:
        method = message.get("method")
        if method is None or "id" not in message:
            return  # responses and notifications are only recorded
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        assert isinstance(params, dict)
        if method == "initialize":
            self._initialize(message, params)
        elif method == "test/emit":
            for raw in params.get("frames", []):
                self._emit(protocol.parse_frame(raw))
            self._reply(message, {"ok": True})
        elif method == "test/burst":
            for n in range(int(params.get("count", 0))):
                item: Message = {"n": n}
                if "tag" in params:
                    item["tag"] = params["tag"]
                if "sessionId" in params:
                    item["sessionId"] = params["sessionId"]
                self._emit(Single({"jsonrpc": "2.0", "method": "test/item", "params": item}))
            self._reply(message, {"ok": True})
        elif method == "test/ask":
            question: Message = {"jsonrpc": "2.0", "id": params.get("askId", "q-1"), "method": "test/question"}
            if "sessionId" in params:
                question["params"] = {"sessionId": params["sessionId"]}
            self._emit(Single(question))
            self._reply(message, {"ok": True})
        elif method == "test/block_loop":
            time.sleep(float(params.get("seconds", 1)))  # freezes the whole worker: an overload
            self._reply(message, {"ok": True})
        elif method == "test/block_input":
            self._reply(message, {"ok": True})
            self._input_open.clear()
        elif method == "test/break_input":
            self._reply(message, {"ok": True})
            self._input_broken = True
        elif method == "test/flood":
            self._reply(message, {"ok": True})
            count, size = int(params.get("count", 0)), int(params.get("size", 0))
            self._flood = asyncio.get_running_loop().create_task(self._run_flood(count, size))
        elif method == "test/flood_stats":
            self._reply(message, {"taken": flood_frames_taken})
        elif method == "test/threads_started":
            self._reply(message, {"started": threads_started})
        elif method == "test/exit":
            self._reply(message, {"ok": True})
            if isinstance(params.get("final"), dict):
                self._emit(Single(params["final"]))
            self._end()
        else:
            self._reply(message, {"method": method, "params": message.get("params")})

    async def _run_flood(self, count: int, size: int) -> None:
        pad = "x" * size
        for n in range(count):
            while self._outbox.qsize() >= FLOOD_QUEUED_FRAMES and not self._closed:
                self._frame_taken.clear()
                await self._frame_taken.wait()
            if self._closed:
                return
            self._emit(Single({"jsonrpc": "2.0", "method": "test/flooded", "params": {"n": n, "pad": pad}}))

    def _initialize(self, message: Message, params: dict[str, Any]) -> None:
        if params.get("hang"):
            return
        if params.get("exit"):
            self._end()
            return
        if params.get("sideTraffic"):
            self._emit(Single({"jsonrpc": "2.0", "method": "test/side", "params": {}}))
            self._emit(Single({"jsonrpc": "2.0", "method": "test/side", "params": {"sessionId": "side-session"}}))
        if params.get("reject"):
            self._emit(Single(protocol.error_response(message["id"], protocol.INVALID_REQUEST, "rejected")))
            return
        self._reply(message, {"protocolVersion": 1, "agentCapabilities": {}})

    def _reply(self, message: Message, result: Any) -> None:
        self._emit(Single({"jsonrpc": "2.0", "id": message["id"], "result": result}))

    def _emit(self, frame: Frame) -> None:
        if not self._closed:
            self._outbox.put_nowait(frame)

    def _end(self) -> None:
        if not self._closed:
            self._closed = True
            self._input_open.set()
            self._outbox.put_nowait(None)


def _batch_reply(entry: Message | MalformedEntry) -> Message | None:
    if isinstance(entry, MalformedEntry):
        return None if protocol.is_response_shaped(entry.value) else protocol.invalid_request()
    if "method" not in entry or "id" not in entry:
        return None
    if entry["method"] == "initialize" and isinstance(entry.get("params"), dict) and entry["params"].get("reject"):
        return protocol.error_response(entry["id"], protocol.INVALID_REQUEST, "rejected")
    return {"jsonrpc": "2.0", "id": entry["id"], "result": {"method": entry["method"], "params": entry.get("params")}}


def _response_shaped_text(raw: str) -> bool:
    try:
        return protocol.is_response_shaped(json.loads(raw))
    except ValueError:
        return False


def create() -> WireAgent:
    return WireAgent()


def broken() -> WireAgent:
    """A factory that fails: the endpoint must answer clearly, not crash."""
    raise RuntimeError("this agent cannot start")
