#!/usr/bin/env python3
"""Interop driver: the official ACP Python SDK client (``agent-client-protocol`` 0.12.1).

Usage::

    python tests/interop/py_client.py http://127.0.0.1:8000/acp   # HTTP: POST + SSE (acp.http)
    python tests/interop/py_client.py ws://127.0.0.1:8000/acp     # WebSocket (acp.ws)
    ACP_TOKEN=... python tests/interop/py_client.py URL          # or --token TOKEN

With a token (``--token``, else the ``ACP_TOKEN`` environment variable) every request (and the
WebSocket upgrade) carries ``Authorization: Bearer <token>``, through the SDK's ``headers=``.

Runs the interop scenario against a server hosting the demo agent (see README.md):
initialize -> session/new -> ``stream 50 64`` -> ``permission`` (answers ``allow``)
-> ``wait_for_cancel`` + session/cancel -> close (DELETE on HTTP, socket close on WS).
Its steps are shared with py_stdio_client.py (a spawned stdio agent), which runs more of them.

Prints exactly one JSON line on stdout summarising what it observed. Exit status: 0 when
every check passed, 1 when one failed (the JSON line has ``"ok": false`` and ``"error"``, and
``"status"`` when an HTTP status refused it, e.g. 401), 2 on a bad URL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlparse

import httpx
from acp import ClientSideConnection, connect_to_agent, text_block
from acp.connection import StreamDirection, StreamEvent
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    ClientCapabilities,
    ContentToolCallContent,
    DeniedOutcome,
    FileSystemCapabilities,
    PermissionOption,
    PromptResponse,
    ReadTextFileResponse,
    RequestPermissionResponse,
    TextContentBlock,
    ToolCallProgress,
    ToolCallStart,
    ToolCallUpdate,
)

T = TypeVar("T")

STREAM_COUNT = 50
STREAM_SIZE = 64
PERMISSION_OPTIONS = ["allow", "reject"]
PERMISSION_CHOICE = "allow"
TOOL_CALL_STATUSES = ["pending", "in_progress", "completed"]
#: What the client answers fs/read_text_file with (two lines, non-ASCII: it must come back unchanged).
FILE_CONTENT = "known content from the client: grüße ✓\nsecond line"
#: Absolute, as ACP requires; never touched on disk: the client answers from memory.
FILE_PATH = os.path.join(tempfile.gettempdir(), "acp-interop-fs-read.txt")
CLOSE_SECONDS = 5.0
_INDEX_PREFIX = re.compile(r"^(\d+)")
_TRANSPORTS = {"http": "http", "https": "http", "ws": "ws", "wss": "ws"}


class CheckFailed(Exception):
    """A scenario check did not hold."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


async def step(label: str, awaitable: Awaitable[T], seconds: float) -> T:
    """Await one scenario step, turning a hang into a failure."""
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        raise CheckFailed(f"{label}: timed out after {seconds:g}s") from None


@dataclass
class ScenarioClient:
    """The ACP client side: collects session updates, answers permission requests with ``allow``
    and fs/read_text_file for FILE_PATH with FILE_CONTENT."""

    updates: list[tuple[str, Any]] = field(default_factory=list)
    permission_requests: list[dict[str, Any]] = field(default_factory=list)
    file_reads: list[dict[str, str]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
        self.arrived.set()

    async def wait_for_chunks(self, count: int) -> None:
        """The SDK runs each notification handler as its own task, so a reply can overtake the
        updates that arrived just before it (in the same network read); wait for them."""
        while sum(isinstance(update, AgentMessageChunk) for _, update in self.updates) < count:
            self.arrived.clear()
            await self.arrived.wait()

    async def request_permission(
        self,
        session_id: str,
        tool_call: ToolCallUpdate,
        options: list[PermissionOption],
        **kwargs: Any,
    ) -> RequestPermissionResponse:
        option_ids = [option.option_id for option in options]
        self.permission_requests.append({"sessionId": session_id, "options": option_ids})
        if PERMISSION_CHOICE in option_ids:
            selected = AllowedOutcome(outcome="selected", option_id=PERMISSION_CHOICE)
            return RequestPermissionResponse(outcome=selected)
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))

    async def read_text_file(
        self, session_id: str, path: str, line: int | None = None, limit: int | None = None, **kwargs: Any
    ) -> ReadTextFileResponse:
        self.file_reads.append({"sessionId": session_id, "path": path})
        return ReadTextFileResponse(content=FILE_CONTENT if path == FILE_PATH else "")

    def take_updates(self) -> list[tuple[str, Any]]:
        taken, self.updates = self.updates, []
        return taken


class WireLog:
    """Connection observer: the JSON-RPC messages the SDK handed to / got from the transport."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self._sent_event = asyncio.Event()

    def __call__(self, event: StreamEvent) -> None:
        if event.direction is StreamDirection.OUTGOING:
            self.sent.append(event.message)
            self._sent_event.set()
        else:
            self.received.append(event.message)

    def sent_methods(self) -> list[str]:
        return [str(message["method"]) for message in self.sent if "method" in message]

    def responses_sent(self) -> int:
        return sum(1 for message in self.sent if "method" not in message)

    async def wait_sent(self, method: str, count: int) -> None:
        """Wait until the transport accepted ``count`` messages of ``method``.

        The observer runs after ``transport.send`` returned: on HTTP once the POST was
        answered (202), on WebSocket once the frame was written.
        """
        while self.sent_methods().count(method) < count:
            self._sent_event.clear()
            await self._sent_event.wait()


class HttpLog:
    """httpx response hook recording each HTTP exchange of the SDK's HTTP transport."""

    def __init__(self) -> None:
        self.exchanges: list[dict[str, Any]] = []

    async def on_response(self, response: httpx.Response) -> None:
        request = response.request
        self.exchanges.append(
            {
                "method": request.method,
                "status": response.status_code,
                "sse": request.headers.get("accept") == "text/event-stream",
                "jsonrpc": describe_message(request.content) if request.method == "POST" else None,
            }
        )

    def summary(self) -> dict[str, Any]:
        exchanges = self.exchanges
        deletes = [exchange["status"] for exchange in exchanges if exchange["method"] == "DELETE"]
        errors = [
            {key: exchange[key] for key in ("method", "status", "jsonrpc") if exchange[key] is not None}
            for exchange in exchanges
            if not 200 <= exchange["status"] < 300
        ]
        return {
            "posts": sum(1 for exchange in exchanges if exchange["method"] == "POST"),
            "streams": sum(1 for exchange in exchanges if exchange["method"] == "GET" and exchange["sse"]),
            "delete": deletes[-1] if deletes else None,
            **({"errors": errors} if errors else {}),
        }


def describe_message(body: bytes) -> str | None:
    """``request <method>``, ``notification <method>`` or ``response`` for a POSTed JSON-RPC body."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict):
        return None
    if "method" in message:
        kind = "request" if "id" in message else "notification"
        return f"{kind} {message['method']}"
    return "response"


def chunk_texts(updates: list[tuple[str, Any]], session_id: str) -> list[str]:
    """Texts of the agent_message_chunk updates, checking they all belong to ``session_id``."""
    texts: list[str] = []
    for update_session, update in updates:
        require(update_session == session_id, f"session/update for another session: {update_session!r}")
        if isinstance(update, AgentMessageChunk):
            content = update.content
            require(isinstance(content, TextContentBlock), f"non-text agent_message_chunk: {content!r}")
            texts.append(content.text)
    return texts


def check_stream_order(texts: list[str]) -> str:
    """Chunks that start with a decimal index must count up by one; else order is unchecked."""
    indices: list[int] = []
    for text in texts:
        match = _INDEX_PREFIX.match(text)
        if match is None:
            return "unchecked"
        indices.append(int(match.group(1)))
    start = indices[0] if indices else 0
    require(indices == list(range(start, start + len(indices))), f"stream: chunks out of order: {indices}")
    return "indexed"


@dataclass
class Run:
    """One run of the scenario: the connection, its client side and what it observed."""

    conn: ClientSideConnection
    client: ScenarioClient
    wire: WireLog
    seconds: float
    summary: dict[str, Any]

    async def prompt(self, label: str, session_id: str, text: str, chunks: int) -> PromptResponse:
        """Send a prompt; its response once the ``chunks`` message chunks before it arrived."""
        self.client.take_updates()
        response = await step(label, self.conn.prompt(session_id=session_id, prompt=[text_block(text)]), self.seconds)
        await step(f"{label}: updates", self.client.wait_for_chunks(chunks), self.seconds)
        return response


async def initialize(run: Run, read_text_file: bool) -> None:
    capabilities = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=read_text_file, write_text_file=False))
    init = await step(
        "initialize", run.conn.initialize(protocol_version=1, client_capabilities=capabilities), run.seconds
    )
    run.summary["protocolVersion"] = init.protocol_version
    require(init.protocol_version == 1, f"initialize: protocolVersion {init.protocol_version}")


async def new_session(run: Run, label: str) -> str:
    """session/new in a fresh temporary directory (no MCP servers); its session id."""
    with tempfile.TemporaryDirectory(prefix="acp-interop-") as cwd:
        session = await step(label, run.conn.new_session(cwd=cwd, mcp_servers=[]), run.seconds)
    require(bool(session.session_id), f"{label}: empty sessionId")
    return session.session_id


async def stream_step(run: Run, session_id: str) -> None:
    """``stream 50 64``: 50 chunks of 64 characters, in order when indexed, then end_turn."""
    started = time.monotonic()
    response = await run.prompt("prompt stream", session_id, f"stream {STREAM_COUNT} {STREAM_SIZE}", STREAM_COUNT)
    run.summary["streamMs"] = round((time.monotonic() - started) * 1000)
    texts = chunk_texts(run.client.take_updates(), session_id)
    run.summary["chunks"] = len(texts)
    run.summary["streamStopReason"] = response.stop_reason
    require(response.stop_reason == "end_turn", f"stream: stopReason {response.stop_reason!r}")
    require(len(texts) == STREAM_COUNT, f"stream: {len(texts)} chunks, expected {STREAM_COUNT}")
    sizes = sorted({len(text) for text in texts})
    require(sizes == [STREAM_SIZE], f"stream: chunk sizes {sizes}, expected {STREAM_SIZE}")
    run.summary["order"] = check_stream_order(texts)


async def tool_calls_step(run: Run, session_id: str) -> None:
    """``tool_calls``: tool_call pending -> tool_call_update in_progress -> completed with text
    content, all for one toolCallId, then the chunk "tool call completed" and end_turn."""
    response = await run.prompt("prompt tool_calls", session_id, "tool_calls", 1)
    updates = run.client.take_updates()
    texts = chunk_texts(updates, session_id)
    kinds = [getattr(update, "session_update", type(update).__name__) for _, update in updates]
    tool_updates = [update for _, update in updates if isinstance(update, ToolCallStart | ToolCallProgress)]
    statuses = [str(update.status) for update in tool_updates]
    ids = {update.tool_call_id for update in tool_updates}
    outputs = [
        item.content.text
        for update in tool_updates
        for item in update.content or []
        if isinstance(item, ContentToolCallContent) and isinstance(item.content, TextContentBlock)
    ]
    output = outputs[-1] if outputs else None
    run.summary["toolCalls"] = statuses
    run.summary["toolCallOutput"] = output
    run.summary["toolCallsText"] = texts[-1] if texts else None
    run.summary["toolCallsStopReason"] = response.stop_reason
    expected_kinds = ["tool_call", "tool_call_update", "tool_call_update", "agent_message_chunk"]
    require(kinds == expected_kinds, f"tool_calls: updates {kinds}, expected {expected_kinds}")
    require(statuses == TOOL_CALL_STATUSES, f"tool_calls: statuses {statuses}, expected {TOOL_CALL_STATUSES}")
    require(len(ids) == 1, f"tool_calls: {len(ids)} toolCallIds, expected one")
    require(bool(output), "tool_calls: the completed update has no text content")
    require(texts == ["tool call completed"], f"tool_calls: chunks {texts}")
    require(response.stop_reason == "end_turn", f"tool_calls: stopReason {response.stop_reason!r}")


async def permission_step(run: Run, session_id: str) -> None:
    """``permission``: one session/request_permission (allow, reject), answered ``allow``; then
    the chunk "permission: allow" and end_turn."""
    asked = len(run.client.permission_requests)
    response = await run.prompt("prompt permission", session_id, "permission", 1)
    texts = chunk_texts(run.client.take_updates(), session_id)
    requests = run.client.permission_requests[asked:]
    run.summary["permission"] = texts[-1] if texts else None
    run.summary["permissionStopReason"] = response.stop_reason
    require(len(requests) == 1, f"permission: {len(requests)} permission requests, expected 1")
    require(requests[0]["sessionId"] == session_id, "permission: request names another session")
    require(requests[0]["options"] == PERMISSION_OPTIONS, f"permission: options {requests[0]['options']}")
    require(texts == [f"permission: {PERMISSION_CHOICE}"], f"permission: chunks {texts}")
    require(response.stop_reason == "end_turn", f"permission: stopReason {response.stop_reason!r}")


async def fs_read_step(run: Run, session_id: str) -> None:
    """``fs_read FILE_PATH``: one fs/read_text_file for FILE_PATH in this session; the agent says
    the content back unchanged, then end_turn."""
    asked = len(run.client.file_reads)
    response = await run.prompt("prompt fs_read", session_id, f"fs_read {FILE_PATH}", 1)
    texts = chunk_texts(run.client.take_updates(), session_id)
    reads = run.client.file_reads[asked:]
    run.summary["fsRead"] = texts[-1] if texts else None
    run.summary["fsReadStopReason"] = response.stop_reason
    require(len(reads) == 1, f"fs_read: {len(reads)} fs/read_text_file requests, expected 1")
    require(reads[0]["sessionId"] == session_id, "fs_read: request names another session")
    require(reads[0]["path"] == FILE_PATH, f"fs_read: asked for {reads[0]['path']!r}")
    require(texts == [FILE_CONTENT], f"fs_read: chunks {texts}")
    require(response.stop_reason == "end_turn", f"fs_read: stopReason {response.stop_reason!r}")


async def cancel_step(run: Run, session_id: str) -> None:
    """``wait_for_cancel``, then session/cancel once the transport accepted the prompt (plus
    100 ms): stopReason cancelled."""
    before = run.wire.sent_methods().count("session/prompt")
    prompt = [text_block("wait_for_cancel")]
    prompt_task = asyncio.ensure_future(run.conn.prompt(session_id=session_id, prompt=prompt))
    try:
        await step("send wait_for_cancel", run.wire.wait_sent("session/prompt", count=before + 1), run.seconds)
        await asyncio.sleep(0.1)
        await step("session/cancel", run.conn.cancel(session_id=session_id), run.seconds)
        response = await step("prompt wait_for_cancel", asyncio.shield(prompt_task), run.seconds)
    finally:
        if not prompt_task.done():
            prompt_task.cancel()
    run.summary["cancel"] = response.stop_reason
    require(response.stop_reason == "cancelled", f"cancel: stopReason {response.stop_reason!r}")


async def echo_step(run: Run, session_id: str, text: str) -> str:
    """``echo <text>`` in one session: exactly the chunk <text>, end_turn; returns the chunk."""
    response = await run.prompt(f"prompt echo {text}", session_id, f"echo {text}", 1)
    texts = chunk_texts(run.client.take_updates(), session_id)
    require(texts == [text], f"echo {text}: chunks {texts}")
    require(response.stop_reason == "end_turn", f"echo {text}: stopReason {response.stop_reason!r}")
    return texts[0]


async def open_transport(url: str, http_client: httpx.AsyncClient, headers: dict[str, str]) -> Any:
    if _TRANSPORTS[urlparse(url).scheme] == "http":
        from acp.http import create_http_stream

        return create_http_stream(url, client=http_client, headers=headers)
    from acp.ws import create_websocket_stream

    return await create_websocket_stream(url, headers=headers)


def refusal_status(error: BaseException) -> int | None:
    """The HTTP status behind a failure, if one refused it (acp.http's AcpHttpStatusError,
    websockets' InvalidStatus), looking through the exception chain."""
    seen: BaseException | None = error
    while seen is not None:
        status = getattr(seen, "status_code", None)
        response = getattr(seen, "response", None)
        if status is None and response is not None:
            status = getattr(response, "status_code", None)
        if isinstance(status, int):
            return status
        seen = seen.__cause__ or seen.__context__
    return None


async def run(url: str, seconds: float, summary: dict[str, Any], token: str | None = None) -> None:
    http_log = HttpLog()
    # The SDK's default client settings (HTTP/2 enabled, no read timeout because SSE streams are
    # long-lived) plus a response hook; passing our own client means we close it ourselves.
    http_client = httpx.AsyncClient(
        http2=True, timeout=httpx.Timeout(None), event_hooks={"response": [http_log.on_response]}
    )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        await scenario(url, seconds, summary, http_client, headers)
    finally:
        await http_client.aclose()
        if summary["transport"] == "http":
            summary["http"] = http_log.summary()
    if summary["transport"] == "http":
        delete_status = summary["http"]["delete"]
        require(
            delete_status is not None and 200 <= delete_status < 300,
            f"close: DELETE answered {delete_status}, expected 2xx",
        )


async def scenario(
    url: str, seconds: float, summary: dict[str, Any], http_client: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    client = ScenarioClient()
    wire = WireLog()
    transport = await step("connect", open_transport(url, http_client, headers), seconds)
    conn = connect_to_agent(client, transport, use_unstable_protocol=True, observers=[wire])
    run = Run(conn, client, wire, seconds, summary)
    closed = False
    try:
        await initialize(run, read_text_file=False)
        session_id = await new_session(run, "session/new")
        summary["session"] = True
        await stream_step(run, session_id)
        await permission_step(run, session_id)
        await cancel_step(run, session_id)

        # close: the HTTP transport DELETEs the connection, the WebSocket one closes the socket
        await step("close", conn.close(), seconds)
        closed = True
        summary["closed"] = True
    finally:
        summary["sent"] = wire.sent_methods()
        summary["responsesSent"] = wire.responses_sent()
        if not closed:
            try:
                await asyncio.wait_for(conn.close(), CLOSE_SECONDS)
            except Exception as exc:
                summary["closeError"] = f"{type(exc).__name__}: {exc}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="ACP endpoint: http(s)://HOST:PORT/acp or ws(s)://HOST:PORT/acp")
    parser.add_argument("--timeout", type=float, default=20.0, help="per-step timeout, seconds (20)")
    parser.add_argument("--token", help="bearer token (default: the ACP_TOKEN environment variable)")
    args = parser.parse_args()
    token = args.token if args.token is not None else os.environ.get("ACP_TOKEN") or None

    transport = _TRANSPORTS.get(urlparse(args.url).scheme)
    summary: dict[str, Any] = {
        "ok": False,
        "client": "python-sdk",
        "transport": transport,
        "url": args.url,
        "auth": "bearer" if token else "none",
    }
    if transport is None:
        summary["error"] = "URL scheme must be http, https, ws or wss"
        print(json.dumps(summary), flush=True)
        print(f"py_client: {summary['error']}", file=sys.stderr)
        return 2
    try:
        asyncio.run(run(args.url, args.timeout, summary, token))
        summary["ok"] = True
    except CheckFailed as exc:
        summary["error"] = str(exc)
    except Exception as exc:  # any failure, e.g. a JSON-RPC error, becomes the one JSON line
        summary["error"] = f"{type(exc).__name__}: {exc}"
        status = refusal_status(exc)
        if status is not None:
            summary["status"] = status
    print(json.dumps(summary), flush=True)
    if not summary["ok"]:
        print(f"py_client: FAILED: {summary['error']}", file=sys.stderr)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
