"""Which stream each agent frame reaches (docs/wire-contract.md §6.4, §7.3, §9; checklist 18, 19,
36, 39, 40, 41), and the client's responses to agent requests (§6.1), over the wire against the
shared `wire_server`. `test/emit` makes the wire agent send raw frames of our choosing.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest

from tests.live import SseReader, initialize, notification, open_sse, post, rpc

T = 5.0
INIT = rpc(0, "initialize", {"protocolVersion": 1})
INVALID_REQUEST = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Invalid Request"}}
OK = {"ok": True}
_ids = itertools.count()


pytestmark = pytest.mark.usefixtures("wire_log_stays_clean")


class Conn:
    """One connection with its connection stream and the session streams a test opens."""

    def __init__(self, http: httpx.AsyncClient, url: str, connection_id: str, stack: AsyncExitStack) -> None:
        self.http, self.url, self.id, self._stack = http, url, connection_id, stack
        self.streams: dict[str | None, SseReader] = {}
        self.pending_emit: dict[str, Any] = {}

    async def open(self, session_id: str | None = None) -> SseReader:
        reader = await self._stack.enter_async_context(open_sse(self.http, self.url, self.id, session_id))
        self.streams[session_id] = reader
        return reader

    async def post(self, body: Any, session_id: str | None = None) -> httpx.Response:
        return await post(self.http, self.url, body, self.id, session_id)

    async def send(self, body: Any, session_id: str | None = None) -> None:
        response = await self.post(body, session_id)
        assert (response.status_code, response.text) == (202, "")

    async def next(self, session_id: str | None = None) -> Any:
        return await self.streams[session_id].next(T)

    async def emit(self, *frames: Any) -> None:
        """The agent sends these frames (raw text, or JSON values), then replies on the connection stream."""
        request_id = f"emit-{next(_ids)}"
        raw = [frame if isinstance(frame, str) else json.dumps(frame) for frame in frames]
        await self.send(rpc(request_id, "test/emit", {"frames": raw}))
        self.pending_emit = {"jsonrpc": "2.0", "id": request_id, "result": OK}

    async def emitted(self) -> None:
        """The reply to the last emit: everything it emitted for the connection stream came first."""
        assert await self.next() == self.pending_emit

    async def nothing_else(self, *session_ids: str | None) -> None:
        """A marker request whose reply goes to the stream is the stream's next event."""
        for session_id in session_ids:
            request_id = f"marker-{next(_ids)}"
            await self.send(rpc(request_id, "x/marker"), session_id)
            params = None if session_id is None else {"sessionId": session_id}
            assert await self.next(session_id) == echo(request_id, "x/marker", params)

    async def received(self) -> list[Any]:
        """What the agent got (its reply is the next connection-stream event)."""
        request_id = f"received-{next(_ids)}"
        await self.send(rpc(request_id, "test/received"))
        reply = await self.next()
        assert reply["id"] == request_id, reply
        return [json.loads(text) for text in reply["result"]["frames"]]


@pytest.fixture
async def conn(http: httpx.AsyncClient, url: str) -> AsyncIterator[Conn]:
    connection_id = await initialize(http, url)
    async with AsyncExitStack() as stack:
        connection = Conn(http, url, connection_id, stack)
        await connection.open()
        yield connection
    await http.delete(url, headers={"Acp-Connection-Id": connection_id})


def echo(request_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": {"method": method, "params": params}}


# -- client batches (§7.3) ----------------------------------------------------------------------------


async def test_session_header_batch_reply_goes_only_to_the_session_stream(conn: Conn) -> None:
    """Checklist 18."""
    await conn.open("s-18")
    await conn.send([rpc(1, "session/prompt", {"prompt": []}), rpc(2, "x/custom", {})], "s-18")
    assert await conn.next("s-18") == [
        echo(1, "session/prompt", {"prompt": [], "sessionId": "s-18"}),
        echo(2, "x/custom", {"sessionId": "s-18"}),
    ]
    assert (await conn.received())[-1] == [
        rpc(1, "session/prompt", {"prompt": [], "sessionId": "s-18"}),
        rpc(2, "x/custom", {"sessionId": "s-18"}),
    ]
    await conn.nothing_else("s-18")


async def test_mixed_batch_reply_goes_to_the_connection_stream(conn: Conn) -> None:
    """Checklist 19: a session entry plus a `$/` entry; the `$/` entry gets no sessionId."""
    await conn.open("s-19")
    await conn.send([rpc(1, "session/prompt", {"prompt": []}), rpc(2, "$/connection", {"x": 1})], "s-19")
    assert await conn.next() == [
        echo(1, "session/prompt", {"prompt": [], "sessionId": "s-19"}),
        echo(2, "$/connection", {"x": 1}),
    ]
    assert (await conn.received())[-1] == [
        rpc(1, "session/prompt", {"prompt": [], "sessionId": "s-19"}),
        rpc(2, "$/connection", {"x": 1}),
    ]
    await conn.nothing_else("s-19")


async def test_batches_over_two_sessions_or_with_an_invalid_entry_go_to_the_connection_stream(conn: Conn) -> None:
    await conn.open("s-a")
    await conn.open("s-b")
    await conn.send([rpc(1, "x/a", {"sessionId": "s-a"}), rpc(2, "x/b", {"sessionId": "s-b"})])
    assert await conn.next() == [echo(1, "x/a", {"sessionId": "s-a"}), echo(2, "x/b", {"sessionId": "s-b"})]
    await conn.send([rpc(3, "x/a"), 17], "s-a")
    assert await conn.next() == [echo(3, "x/a", {"sessionId": "s-a"}), INVALID_REQUEST]
    await conn.nothing_else("s-a", "s-b", None)


async def test_duplicate_ids_consume_one_route_each(conn: Conn) -> None:
    """Checklist 41: two pending routes with the same id, both consumed by a 2-entry reply."""
    await conn.open("s-41")
    await conn.send([rpc("dup", "x/a", {"sessionId": "s-41"}), rpc("dup", "x/b", {"sessionId": "s-41"})])
    assert await conn.next("s-41") == [
        echo("dup", "x/a", {"sessionId": "s-41"}),
        echo("dup", "x/b", {"sessionId": "s-41"}),
    ]
    # no route is left for "dup": a further reply with that id goes to the connection stream
    late = {"jsonrpc": "2.0", "id": "dup", "result": {"late": True}}
    await conn.emit(late)
    assert await conn.next() == late
    await conn.emitted()
    await conn.nothing_else("s-41")


# -- single replies: the route recorded at POST time (§6.4, §9) -----------------------------------


async def test_replies_follow_the_session_of_their_request(conn: Conn) -> None:
    for session_id in ("s-src", "s-load", "s-custom", ""):
        await conn.open(session_id)
    cases: list[tuple[dict[str, Any], str | None, str | None]] = [
        # (request, Acp-Session-Id header, stream of the reply)
        (rpc(1, "session/new", {"cwd": "/", "mcpServers": []}), None, None),
        (rpc(2, "session/list", {}), None, None),
        (rpc(3, "authenticate", {"methodId": "m"}), None, None),
        (rpc(4, "x/custom", {"a": 1}), None, None),
        (rpc(5, "session/prompt", {"sessionId": "s-src", "prompt": []}), None, "s-src"),
        (rpc(6, "session/fork", {"sessionId": "s-src", "cwd": "/"}), None, "s-src"),
        (rpc(7, "session/fork", {"cwd": "/"}), "s-src", "s-src"),
        (rpc(8, "session/load", {"cwd": "/"}), "s-load", "s-load"),
        (rpc(9, "session/new", {"cwd": "/", "mcpServers": []}), "s-load", "s-load"),
        (rpc(10, "x/custom", {"sessionId": "s-custom"}), None, "s-custom"),
        (rpc(11, "$/custom", {"sessionId": "s-custom"}), "s-custom", None),
        (rpc(12, "session/prompt", {"prompt": []}), "", ""),  # the empty session id is a session
    ]
    for request, header, stream in cases:
        await conn.send(request, header)
        params = dict(request["params"])
        if header is not None and not request["method"].startswith("$/"):
            params["sessionId"] = header
        assert await conn.next(stream) == echo(request["id"], request["method"], params), request
    await conn.nothing_else(None, "s-src", "s-load", "s-custom", "")


async def test_a_reply_is_routed_by_its_request_never_by_its_content(conn: Conn) -> None:
    """The agent answers `test/emit` twice: the first reply with its id takes the recorded route
    (the session of the request); the second finds no route left. Ids keep their JSON type."""
    await conn.open("s-route")
    frames = [
        json.dumps({"jsonrpc": "2.0", "id": "7", "result": {"sessionId": "s-route"}}),  # string id: no route
        json.dumps({"jsonrpc": "2.0", "id": 7, "result": {"early": True}}),
        json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": "x"}}),
    ]
    await conn.send(rpc(7, "test/emit", {"frames": frames}), "s-route")
    assert await conn.next() == json.loads(frames[0])
    assert await conn.next("s-route") == json.loads(frames[1])
    assert await conn.next() == json.loads(frames[2])
    assert await conn.next() == {"jsonrpc": "2.0", "id": 7, "result": OK}
    await conn.nothing_else("s-route", None)


# -- agent-originated frames ---------------------------------------------------------------------------


async def test_agent_notifications_and_requests_route_by_session(conn: Conn) -> None:
    """Checklist 39 and §6.4: `$/` (and a wrapped cancel) stays on the connection stream."""
    await conn.open("s-39")
    update = notification("session/update", {"sessionId": "s-39", "update": {}})
    question = rpc("agent-1", "session/request_permission", {"sessionId": "s-39"})
    cancel = notification("$/cancel_request", {"requestId": 1, "sessionId": "s-39"})
    # a nested `_proxy/successor` envelope (params are the wrapped message, flattened)
    inner = {"method": "$/cancel_request", "params": {"requestId": 2}}
    wrapped = notification("_proxy/successor", {"sessionId": "s-39", "method": "_proxy/successor", "params": inner})
    dollar_request = rpc("agent-2", "$/ping", {"sessionId": "s-39"})
    plain = notification("x/note", {"sessionId": 5})
    await conn.emit(update, question, cancel, wrapped, dollar_request, plain)
    assert await conn.next("s-39") == update
    assert await conn.next("s-39") == question
    for frame in (cancel, wrapped, dollar_request, plain):
        assert await conn.next() == frame
    await conn.emitted()
    await conn.nothing_else("s-39")


async def test_malformed_agent_output_is_relayed_raw_and_the_connection_goes_on(conn: Conn) -> None:
    """Checklist 36."""
    await conn.emit("{not json", "[]", "17", "line one\nline two", "a\r\nb", "x\n\ny", ": not a comment")
    assert await conn.next() == "{not json"
    assert await conn.next() == []
    assert await conn.next() == 17
    # raw text with line breaks becomes several `data:` lines of one event
    assert await conn.next() == "line one\nline two"
    assert await conn.next() == "a\nb"
    assert await conn.next() == "x\n\ny"
    assert await conn.next() == ": not a comment"
    await conn.emitted()
    await conn.nothing_else(None)


async def test_an_agent_batch_is_one_connection_stream_event(conn: Conn) -> None:
    """Checklist 40: even when every entry names the same session."""
    await conn.open("s-40")
    batch = [
        notification("session/update", {"sessionId": "s-40", "n": 1}),
        notification("session/update", {"sessionId": "s-40", "n": 2}),
    ]
    await conn.emit(batch)
    assert await conn.next() == batch
    await conn.emitted()
    await conn.nothing_else("s-40")


# -- responses to agent requests (§6.1) ---------------------------------------------------------------


async def test_responses_to_agent_requests(conn: Conn) -> None:
    await conn.open("s-q")

    async def ask(ask_id: Any, session_id: str | None) -> None:
        params: dict[str, Any] = {"askId": ask_id}
        question: dict[str, Any] = {"jsonrpc": "2.0", "id": ask_id, "method": "test/question"}
        if session_id is not None:
            params["sessionId"] = session_id
            question["params"] = {"sessionId": session_id}
        request_id = f"ask-{next(_ids)}"
        await conn.send(rpc(request_id, "test/ask", params))
        assert await conn.next(session_id) == question
        assert await conn.next(session_id) == {"jsonrpc": "2.0", "id": request_id, "result": OK}

    def answer(answer_id: Any) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": answer_id, "result": {"outcome": "allow"}}

    await ask("q-1", "s-q")
    await conn.send(answer("q-1"))  # no session header: accepted
    await ask(2, "s-q")
    await conn.send(answer(2), "s-q")  # the matching session header: accepted
    await ask("q-3", "s-q")
    response = await conn.post(answer("q-3"), "s-other")  # another session's header: refused
    assert response.status_code == 400
    assert "Acp-Session-Id" in response.text
    await conn.send(answer("q-3"))  # the refused response was not used up
    await ask("q-4", None)  # a question on the connection stream
    await conn.send(answer("q-4"))
    await conn.send([{"jsonrpc": "2.0", "id": "nobody", "result": {}}], "s-any")  # no such request: ignored
    responses = [frame for frame in await conn.received() if isinstance(frame, list) or "method" not in frame]
    assert responses == [
        answer("q-1"),
        answer(2),
        answer("q-3"),
        answer("q-4"),
        [{"jsonrpc": "2.0", "id": "nobody", "result": {}}],
    ]
    await conn.nothing_else("s-q")
