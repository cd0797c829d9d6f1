"""`POST /acp` over the wire (docs/wire-contract.md §2.1, §4.3, §5, §7.2), row by row, and the
other methods (§2: 405, OPTIONS without CORS, no redirect of `/acp/`).

Every test talks HTTP to the shared `wire_server` (daphne hosting tests/wire_agent.py, which echoes
requests and reports the frames it received through `test/received`).
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from acp_channels import _protocol as protocol
from acp_channels._host import RESUME_META_KEY, resume_capabilities
from tests.live import JSON, DaphneServer, SseReader, initialize, notification, open_sse, post, rpc

T = 5.0  # seconds any single expected event may take
LIMIT = 16 * 1024 * 1024
# A random UUID v4, as in the reference; a `.<worker id>` suffix routes it to its worker (DESIGN).
UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}(\.[0-9A-Za-z_-]+)?$")
CONNECTION_REQUIRED = "Acp-Connection-Id header required"
MISMATCH = "Acp-Session-Id header does not match params.sessionId"
NON_STRING = "params.sessionId must be a string"
ARRAY_PARAMS = "Acp-Session-Id header requires object params"
SESSION_REQUIRED = "Acp-Session-Id header required"
SESSION_SCOPED = [
    "session/prompt",
    "session/cancel",
    "session/close",
    "session/delete",
    "session/fork",
    "session/load",
    "session/resume",
    "session/set_config_option",
    "session/set_mode",
    "session/set_model",
]
INIT = rpc(0, "initialize", {"protocolVersion": 1})
#: What the server adds to an initialize result: how streams resume, where the directory is.
SERVER_META = {
    RESUME_META_KEY: resume_capabilities(),
    "acp-channels/sessions": {
        "directory": "/acp/sessions",
        "listMethod": "_acp-channels/sessions/list",
        "attach": {"header": "Acp-Attach-Session", "cursorHeader": "Acp-Attach-Cursor"},
    },
    # The servers of these tests run with the default settings (DETACHED_SECONDS is the longer).
    "acp/transport": {
        "resumable": {"retentionMessages": 16384, "retentionBytes": 2 * 1024 * 1024, "retentionSeconds": 14400.0}
    },
}
#: The wire agent's initialize result, with what the server adds.
INIT_RESULT = {"protocolVersion": 1, "agentCapabilities": {}, "_meta": SERVER_META}
_ids = itertools.count()


pytestmark = pytest.mark.usefixtures("wire_log_stays_clean")


def echo(request_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    """The wire agent's reply to a request it does not know: it echoes method and params."""
    return {"jsonrpc": "2.0", "id": request_id, "result": {"method": method, "params": params}}


def advertised(reply: dict[str, Any]) -> dict[str, Any]:
    """`reply` to the initialize that opened a connection, with what the server adds."""
    return {**reply, "result": {**reply["result"], "_meta": SERVER_META}}


def assert_text(response: httpx.Response, status: int, text: str) -> None:
    assert (response.status_code, response.text) == (status, text)
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert "acp-connection-id" not in response.headers
    assert "acp-session-id" not in response.headers


def assert_bare(response: httpx.Response, status: int) -> None:
    assert (response.status_code, response.content) == (status, b"")
    assert "content-type" not in response.headers
    assert "acp-connection-id" not in response.headers
    assert "acp-session-id" not in response.headers


async def accepted(
    http: httpx.AsyncClient, url: str, body: Any, connection_id: str, session_id: str | None = None
) -> None:
    assert_bare(await post(http, url, body, connection_id, session_id), 202)


async def received(
    http: httpx.AsyncClient, url: str, connection_id: str, stream: SseReader, *, raw: bool = False
) -> list[Any]:
    """The frames the agent got so far (parsed when they are JSON, unless `raw`). The
    `test/received` reply goes to the connection stream and must be its next event: it also
    proves nothing came before it."""
    request_id = f"received-{next(_ids)}"
    await accepted(http, url, rpc(request_id, "test/received"), connection_id)
    reply = await stream.next(T)
    assert reply["id"] == request_id, reply
    frames = []
    for text in reply["result"]["frames"]:
        try:
            frames.append(text if raw else json.loads(text))
        except ValueError:
            frames.append(text)
    return frames


@pytest.fixture
async def connection(http: httpx.AsyncClient, url: str) -> AsyncIterator[tuple[str, SseReader]]:
    """A fresh connection and its open connection stream; deleted afterwards."""
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id) as stream:
        yield connection_id, stream
    await http.delete(url, headers={"Acp-Connection-Id": connection_id})


# -- row 1: Content-Type -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "text/json",
        "application/jso",
        "application/jsonfoo",
        "application/json-seq",
        "application/json;charset=latin-1",
        b"application/json\xe9",
    ],
    ids=["missing", "text-plain", "text-json", "truncated", "suffix", "json-seq", "latin-1", "non-ascii"],
)
async def test_415_unless_content_type_is_application_json(
    http: httpx.AsyncClient, url: str, content_type: str | bytes | None
) -> None:
    value = content_type.encode() if isinstance(content_type, str) else content_type
    headers = {} if value is None else {b"Content-Type": value}
    response = await http.post(url, headers=headers, content=json.dumps(INIT).encode())
    if content_type is None:
        assert "content-type" not in response.request.headers
    assert_text(response, 415, "Content-Type must be application/json")


async def test_a_form_body_reaches_the_endpoint_unparsed(http: httpx.AsyncClient, url: str) -> None:
    # Twisted parses POSTed forms for its own request.args (which daphne never reads), and
    # answered a malformed multipart body 400 itself, closing the connection.
    for content_type in ("multipart/form-data; boundary=x", "application/x-www-form-urlencoded"):
        response = await http.post(url, headers={"Content-Type": content_type}, content=b"--x\r\nbroken")
        assert_text(response, 415, "Content-Type must be application/json")


async def test_415_comes_before_every_other_check(http: httpx.AsyncClient, url: str) -> None:
    # invalid UTF-8 (row 5), no connection id (row 7), unknown id (row 8): 415 wins
    response = await http.post(url, headers={"Content-Type": "text/plain"}, content=b"\xff")
    assert_text(response, 415, "Content-Type must be application/json")
    headers = {"Content-Type": "text/plain", "Acp-Connection-Id": str(uuid.uuid4())}
    response = await http.post(url, headers=headers, content=b"{}")
    assert_text(response, 415, "Content-Type must be application/json")


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/json;charset=UTF-8",
        'Application/JSON;charset="UTF-8"',
        "APPLICATION/JSON",
    ],
)
async def test_content_type_is_application_json_in_any_case_with_parameters(
    http: httpx.AsyncClient, url: str, content_type: str
) -> None:
    response = await http.post(url, headers={"Content-Type": content_type}, content=json.dumps(INIT))
    assert response.status_code == 200, response.text
    assert UUID4.match(response.headers["acp-connection-id"])


# -- rows 2-3: body size ---------------------------------------------------------------------------


def padded(message: dict[str, Any], size: int) -> bytes:
    """A valid JSON body of exactly `size` bytes (trailing whitespace)."""
    body = json.dumps(message).encode()
    return body + b" " * (size - len(body))


async def test_413_when_content_length_exceeds_16_mib(http: httpx.AsyncClient, url: str) -> None:
    response = await http.post(url, headers=JSON, content=padded(INIT, LIMIT + 1))
    assert response.request.headers["content-length"] == str(LIMIT + 1)
    assert_text(response, 413, "POST body too large")


async def test_413_when_a_chunked_body_grows_past_16_mib(http: httpx.AsyncClient, url: str) -> None:
    body = padded(INIT, LIMIT + 1)

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 1024 * 1024):
            yield body[start : start + 1024 * 1024]

    response = await http.post(url, headers=JSON, content=chunks())
    assert "content-length" not in response.request.headers
    assert response.request.headers["transfer-encoding"] == "chunked"
    assert_text(response, 413, "POST body too large")


async def test_a_body_of_exactly_16_mib_is_accepted(http: httpx.AsyncClient, url: str) -> None:
    response = await http.post(url, headers=JSON, content=padded(INIT, LIMIT))
    assert response.status_code == 200, response.text[:200]
    assert UUID4.match(response.headers["acp-connection-id"])


async def test_a_small_chunked_body_is_read_whole(http: httpx.AsyncClient, url: str) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        body = json.dumps(INIT).encode()
        yield body[:10]
        yield body[10:]

    response = await http.post(url, headers=JSON, content=chunks())
    assert "content-length" not in response.request.headers
    assert response.status_code == 200, response.text
    assert response.json() == {"jsonrpc": "2.0", "id": 0, "result": INIT_RESULT}


# -- row 5: UTF-8 ----------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [b"\xff", b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":"\xc3"}}'])
async def test_400_for_invalid_utf8_before_any_connection_check(http: httpx.AsyncClient, url: str, body: bytes) -> None:
    response = await http.post(url, headers=JSON, content=body)
    assert response.status_code == 400
    assert response.text.startswith("Invalid JSON-RPC: "), response.text
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert "acp-connection-id" not in response.headers


async def test_invalid_utf8_on_an_open_connection_is_400_and_not_forwarded(
    http: httpx.AsyncClient, url: str, connection: tuple[str, SseReader]
) -> None:
    connection_id, stream = connection
    response = await http.post(url, headers={**JSON, "Acp-Connection-Id": connection_id}, content=b"[\xfe]")
    assert response.status_code == 400
    assert response.text.startswith("Invalid JSON-RPC: "), response.text
    assert await received(http, url, connection_id, stream) == [INIT]


# -- row 6 / §5: initialize -----------------------------------------------------------------------


async def test_initialize_single_returns_the_reply_and_a_new_connection_id(http: httpx.AsyncClient, url: str) -> None:
    response = await post(http, url, INIT)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert "acp-session-id" not in response.headers
    connection_id = response.headers["acp-connection-id"]
    assert UUID4.match(connection_id), connection_id
    assert response.text == protocol.dumps({"jsonrpc": "2.0", "id": 0, "result": INIT_RESULT})  # compact JSON
    other = await post(http, url, INIT)
    assert other.headers["acp-connection-id"] != connection_id
    async with open_sse(http, url, connection_id) as stream:
        assert await received(http, url, connection_id, stream) == [INIT]


@pytest.mark.parametrize("init_id", ["init-7", None, 2**63 - 1])
async def test_initialize_reply_keeps_the_request_id(http: httpx.AsyncClient, url: str, init_id: Any) -> None:
    response = await post(http, url, rpc(init_id, "initialize", {"protocolVersion": 1}))
    assert response.status_code == 200, response.text
    assert UUID4.match(response.headers["acp-connection-id"])
    assert response.json() == {"jsonrpc": "2.0", "id": init_id, "result": INIT_RESULT}


async def test_initialize_ignores_a_session_header_on_a_single_initialize(http: httpx.AsyncClient, url: str) -> None:
    response = await post(http, url, INIT, session_id="s-init")
    assert response.status_code == 200, response.text
    connection_id = response.headers["acp-connection-id"]
    async with open_sse(http, url, connection_id) as stream:
        assert await received(http, url, connection_id, stream) == [INIT]


async def test_rejected_initialize_is_200_with_the_error_and_no_connection(http: httpx.AsyncClient, url: str) -> None:
    response = await post(http, url, rpc(1, "initialize", {"protocolVersion": 1, "reject": True}))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert "acp-connection-id" not in response.headers
    assert response.json() == {"jsonrpc": "2.0", "id": 1, "error": {"code": -32600, "message": "rejected"}}


async def test_initialize_that_ends_the_agent_is_500_without_a_connection(http: httpx.AsyncClient, url: str) -> None:
    response = await post(http, url, rpc(1, "initialize", {"exit": True}))
    assert_text(response, 500, "agent closed before initialize response")


async def test_initialize_abandoned_by_the_client_leaves_the_server_healthy(http: httpx.AsyncClient, url: str) -> None:
    with pytest.raises(httpx.ReadTimeout):
        await http.post(url, headers=JSON, json=rpc(1, "initialize", {"hang": True}), timeout=0.3)
    assert (await post(http, url, INIT)).status_code == 200


async def test_initial_batch_returns_the_grouped_reply_and_a_connection(http: httpx.AsyncClient, url: str) -> None:
    """Checklist 14."""
    batch = [rpc(1, "initialize", {"protocolVersion": 1}), rpc(2, "x/custom", {"a": 1})]
    response = await post(http, url, batch)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    connection_id = response.headers["acp-connection-id"]
    assert response.json() == [advertised(echo(1, "initialize", {"protocolVersion": 1})), echo(2, "x/custom", {"a": 1})]
    async with open_sse(http, url, connection_id) as stream:
        assert await received(http, url, connection_id, stream) == [batch]


async def test_side_traffic_before_the_init_reply_waits_on_its_streams(http: httpx.AsyncClient, url: str) -> None:
    """Checklist 15 (the wire agent sends side traffic for a single initialize)."""
    response = await post(http, url, rpc(1, "initialize", {"sideTraffic": True}))
    assert response.status_code == 200
    assert response.json()["id"] == 1
    connection_id = response.headers["acp-connection-id"]
    async with open_sse(http, url, connection_id) as stream:
        assert await stream.next(T) == notification("test/side", {})
        async with open_sse(http, url, connection_id, "side-session") as session:
            assert await session.next(T) == notification("test/side", {"sessionId": "side-session"})
            await accepted(http, url, rpc("mark", "x/mark"), connection_id, "side-session")
            assert await session.next(T) == echo("mark", "x/mark", {"sessionId": "side-session"})
        # nothing else was waiting on the connection stream
        assert await received(http, url, connection_id, stream) == [
            rpc(1, "initialize", {"sideTraffic": True}),
            rpc("mark", "x/mark", {"sessionId": "side-session"}),
        ]


async def test_initial_batch_skips_response_shaped_predecessors(http: httpx.AsyncClient, url: str) -> None:
    """Checklist 16: the whole frame is forwarded; the predecessors get no reply."""
    batch = [
        {"jsonrpc": "2.0", "id": "r-1", "result": {}},
        {"jsonrpc": "2.0", "id": "r-2", "result": {}, "error": {"code": 1, "message": "both"}},
        {"id": "r-3", "error": {"code": 1, "message": "no jsonrpc"}},
        rpc(1, "initialize", {"protocolVersion": 1}),
        rpc(2, "x/custom"),
    ]
    response = await post(http, url, batch)
    assert response.status_code == 200, response.text
    connection_id = response.headers["acp-connection-id"]
    assert response.json() == [advertised(echo(1, "initialize", {"protocolVersion": 1})), echo(2, "x/custom")]
    async with open_sse(http, url, connection_id) as stream:
        assert await received(http, url, connection_id, stream) == [batch]


NOT_INITIAL = {
    "scalar-first": [17, INIT],
    "empty-object-first": [{}, INIT],
    "notification-first": [notification("x/note"), INIT],
    "request-first": [rpc(5, "x/other"), INIT],
    "initialize-notification": [notification("initialize", {"protocolVersion": 1})],
    "responses-only": [{"jsonrpc": "2.0", "id": 1, "result": {}}],
    "single-initialize-notification": notification("initialize", {"protocolVersion": 1}),
    "single-request": rpc(1, "session/new", {"cwd": "/", "mcpServers": []}),
    "single-response": {"jsonrpc": "2.0", "id": 1, "result": {}},
    "empty-batch": [],
    "invalid-json": '{"jsonrpc":"2.0","id":0,"method":"initialize"',
    "scalar": "17",
}


@pytest.mark.parametrize("body", NOT_INITIAL.values(), ids=NOT_INITIAL.keys())
async def test_400_without_a_connection_id_unless_initial_initialize(
    http: httpx.AsyncClient, url: str, body: Any
) -> None:
    """Checklist 17 and row 7."""
    assert_text(await post(http, url, body), 400, CONNECTION_REQUIRED)


async def test_a_non_initial_batch_with_initialize_goes_to_the_existing_connection(
    http: httpx.AsyncClient, url: str, connection: tuple[str, SseReader]
) -> None:
    connection_id, stream = connection
    batch = [notification("x/note"), rpc(5, "initialize", {"protocolVersion": 1})]
    await accepted(http, url, batch, connection_id)
    assert await stream.next(T) == [echo(5, "initialize", {"protocolVersion": 1})]
    assert await received(http, url, connection_id, stream) == [INIT, batch]


async def test_rejected_initialize_in_a_batch_returns_the_group_without_a_connection(
    http: httpx.AsyncClient, url: str
) -> None:
    """Checklist 21."""
    batch = [rpc(1, "initialize", {"protocolVersion": 1, "reject": True}), rpc(2, "x/custom", {"ok": True})]
    response = await post(http, url, batch)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert "acp-connection-id" not in response.headers
    assert response.json() == [
        {"jsonrpc": "2.0", "id": 1, "error": {"code": -32600, "message": "rejected"}},
        echo(2, "x/custom", {"ok": True}),
    ]


@pytest.mark.parametrize(
    ("session_id", "sibling", "text"),
    [
        (None, rpc(2, "session/prompt", {"prompt": []}), SESSION_REQUIRED),
        ("s-a", rpc(2, "session/prompt", {"sessionId": "s-b", "prompt": []}), MISMATCH),
        ("s-a", rpc(2, "x/custom", [1]), ARRAY_PARAMS),
        ("s-a", rpc(2, "x/custom", {"sessionId": 3}), NON_STRING),
    ],
    ids=["required", "mismatch", "array", "non-string"],
)
async def test_initial_batch_with_a_bad_sibling_is_400_before_any_connection(
    http: httpx.AsyncClient, url: str, session_id: str | None, sibling: dict[str, Any], text: str
) -> None:
    response = await post(http, url, [rpc(1, "initialize", {"protocolVersion": 1}), sibling], None, session_id)
    assert_text(response, 400, text)


async def test_initialize_with_a_connection_id_creates_a_new_connection(
    http: httpx.AsyncClient, url: str, connection: tuple[str, SseReader]
) -> None:
    connection_id, stream = connection
    second_init = rpc(9, "initialize", {"protocolVersion": 1, "second": True})
    response = await post(http, url, second_init, connection_id)
    assert response.status_code == 200
    new_id = response.headers["acp-connection-id"]
    assert new_id != connection_id
    assert response.json()["id"] == 9
    # the old connection is untouched and still works; the new one has its own agent
    assert await received(http, url, connection_id, stream) == [INIT]
    async with open_sse(http, url, new_id) as new_stream:
        assert await received(http, url, new_id, new_stream) == [second_init]


# -- rows 7-8: connection id -------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, b"caf\xe9"], ids=["missing", "non-ascii"])
async def test_400_without_a_usable_connection_id(http: httpx.AsyncClient, url: str, value: bytes | None) -> None:
    headers: dict[str, Any] = dict(JSON)
    if value is not None:
        headers["Acp-Connection-Id"] = value
    response = await http.post(url, headers=headers, content=json.dumps(rpc(1, "session/list")))
    assert_text(response, 400, CONNECTION_REQUIRED)


@pytest.mark.parametrize("connection_id", [str(uuid.uuid4()), "not-a-uuid"], ids=["uuid", "not-a-uuid"])
async def test_404_for_an_unknown_connection(http: httpx.AsyncClient, url: str, connection_id: str) -> None:
    assert_bare(await post(http, url, rpc(1, "session/list"), connection_id), 404)
    # the session checks (row 9) come after the connection lookup
    assert_bare(await post(http, url, rpc(1, "session/prompt"), connection_id), 404)


async def test_only_the_first_connection_id_value_counts(
    http: httpx.AsyncClient, url: str, connection: tuple[str, SseReader]
) -> None:
    """§3.1: `HeaderMap::get` reads the first of repeated headers."""
    connection_id, _ = connection
    headers = [*JSON.items(), ("Acp-Connection-Id", connection_id), ("Acp-Connection-Id", "other")]
    response = await http.post(url, headers=headers, content=json.dumps(rpc(1, "x/first")))
    assert response.status_code == 202


# -- row 9: session processing ------------------------------------------------------------------------


async def test_session_header_errors_are_400_and_nothing_is_forwarded(
    http: httpx.AsyncClient, url: str, connection: tuple[str, SseReader]
) -> None:
    """Checklist 29, 30 and the four texts of row 9."""
    connection_id, stream = connection
    cases: list[tuple[Any, str | None, str]] = [
        (rpc(1, "session/prompt", {"sessionId": "s-1", "prompt": []}), "s-2", MISMATCH),
        (notification("session/cancel", {"sessionId": "s-1"}), "s-2", MISMATCH),
        (rpc(1, "session/prompt", {"sessionId": 5, "prompt": []}), "s-2", NON_STRING),
        (rpc(1, "x/custom", {"sessionId": None}), "s-2", NON_STRING),
        (rpc(1, "session/prompt", ["s-2"]), "s-2", ARRAY_PARAMS),
        (notification("x/note", []), "s-2", ARRAY_PARAMS),
        (rpc(1, "session/prompt", {"sessionId": 5}), None, SESSION_REQUIRED),
        (rpc(1, "session/fork", {}), None, SESSION_REQUIRED),
        (notification("session/cancel"), None, SESSION_REQUIRED),
        *[(rpc(1, method, {"cwd": "/"}), None, SESSION_REQUIRED) for method in SESSION_SCOPED],
        # batches: one bad entry rejects the whole POST; the first bad entry names the error
        ([rpc(1, "x/ok"), rpc(2, "session/delete", {})], None, SESSION_REQUIRED),
        ([rpc(1, "x/ok"), rpc(2, "session/prompt", {"sessionId": "other"})], "s-2", MISMATCH),
        ([rpc(1, "x/ok", [1]), rpc(2, "session/prompt", {"sessionId": "other"})], "s-2", ARRAY_PARAMS),
        ([17, notification("x/ok"), rpc(2, "session/load", {"sessionId": 1})], None, SESSION_REQUIRED),
    ]
    for body, session_id, text in cases:
        response = await post(http, url, body, connection_id, session_id)
        assert (response.status_code, response.text) == (400, text), body
        assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert await received(http, url, connection_id, stream) == [INIT]


async def test_session_header_is_injected_into_params(
    http: httpx.AsyncClient, url: str, connection: tuple[str, SseReader]
) -> None:
    """Checklist 27, and params absent becomes {"sessionId": S}."""
    connection_id, stream = connection
    async with open_sse(http, url, connection_id, "s-27") as session:
        await accepted(http, url, rpc(1, "session/prompt", {"prompt": []}), connection_id, "s-27")
        assert await session.next(T) == echo(1, "session/prompt", {"prompt": [], "sessionId": "s-27"})
        await accepted(http, url, rpc(2, "x/bare"), connection_id, "s-27")
        assert await session.next(T) == echo(2, "x/bare", {"sessionId": "s-27"})
        await accepted(http, url, rpc(3, "session/prompt", {"sessionId": "s-27"}), connection_id, "s-27")
        assert await session.next(T) == echo(3, "session/prompt", {"sessionId": "s-27"})
    assert await received(http, url, connection_id, stream) == [
        INIT,
        rpc(1, "session/prompt", {"prompt": [], "sessionId": "s-27"}),
        rpc(2, "x/bare", {"sessionId": "s-27"}),
        rpc(3, "session/prompt", {"sessionId": "s-27"}),
    ]


async def test_connection_scoped_messages_ignore_the_session_header(
    http: httpx.AsyncClient, url: str, connection: tuple[str, SseReader]
) -> None:
    """Checklist 28, plus a wrapped cancel and a `$/` request (its reply is connection-scoped)."""
    connection_id, stream = connection
    cancel = notification("$/cancel_request", {"requestId": 1})
    # the `_proxy/successor` envelope flattens the wrapped message into its params (SuccessorMessage)
    wrapped = notification("_proxy/successor", {"method": "$/cancel_request", "params": {"requestId": 2}})
    dollar = rpc("d-1", "$/custom", {"sessionId": "elsewhere"})
    for message in (cancel, wrapped, dollar):
        await accepted(http, url, message, connection_id, "s-28")
    assert await stream.next(T) == echo("d-1", "$/custom", {"sessionId": "elsewhere"})
    assert await received(http, url, connection_id, stream) == [INIT, cancel, wrapped, dollar]


# -- row 11 and §7.2: 202 for everything else --------------------------------------------------------


async def test_bad_json_on_an_open_connection_is_202_with_errors_on_the_connection_stream(
    http: httpx.AsyncClient, url: str, connection: tuple[str, SseReader]
) -> None:
    connection_id, stream = connection
    invalid_request = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Invalid Request"}}
    # not JSON to a strict (serde_json-like) parser: NaN, out-of-range numbers, lone surrogates
    parse_errors = ["{not json", "", '{"a":\n1', '{"a":NaN}', "[1e999]", '"\\ud800"']
    invalid = ["[]", "17", "{}", '{"jsonrpc":"1.0","id":1,"method":"x"}']
    for body in parse_errors + invalid:
        await accepted(http, url, body, connection_id)
    for body in parse_errors:
        parse_error = {"code": -32700, "message": "Parse error", "data": {"line": body}}
        assert await stream.next(T) == {"jsonrpc": "2.0", "id": None, "error": parse_error}
    for _ in invalid:
        assert await stream.next(T) == invalid_request  # standalone, even for `[]`
    # the frames go to the agent as they came
    frames = await received(http, url, connection_id, stream, raw=True)
    assert json.loads(frames[0]) == INIT
    assert frames[1:] == [*parse_errors, *invalid]


async def test_batches_after_init_are_202_with_one_grouped_reply(
    http: httpx.AsyncClient, url: str, connection: tuple[str, SseReader]
) -> None:
    connection_id, stream = connection
    invalid_request = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Invalid Request"}}
    await accepted(http, url, [notification("x/a"), notification("x/b")], connection_id)  # no reply at all
    await accepted(http, url, [17, rpc(3, "x/c"), notification("x/d")], connection_id)
    assert await stream.next(T) == [invalid_request, echo(3, "x/c")]
    frames = await received(http, url, connection_id, stream)
    assert frames == [INIT, [notification("x/a"), notification("x/b")], [17, rpc(3, "x/c"), notification("x/d")]]


async def test_notifications_and_responses_are_202_with_nothing_on_the_stream(
    http: httpx.AsyncClient, url: str, connection: tuple[str, SseReader]
) -> None:
    connection_id, stream = connection
    response = await post(http, url, notification("x/note"), connection_id)
    assert_bare(response, 202)
    assert_bare(await post(http, url, {"jsonrpc": "2.0", "id": "nobody", "result": {}}, connection_id), 202)
    assert await received(http, url, connection_id, stream) == [
        INIT,
        notification("x/note"),
        {"jsonrpc": "2.0", "id": "nobody", "result": {}},
    ]


async def test_post_ignores_accept_and_query_string(
    http: httpx.AsyncClient, url: str, connection: tuple[str, SseReader]
) -> None:
    connection_id, stream = connection
    response = await post(http, url + "?x=1", rpc(1, "x/q"), connection_id, Accept="text/event-stream")
    assert_bare(response, 202)
    assert await stream.next(T) == echo(1, "x/q")
    response = await http.post(url + "?a=b", headers=JSON, json=INIT)
    assert response.status_code == 200
    assert UUID4.match(response.headers["acp-connection-id"])


# -- other methods and paths (§2) -------------------------------------------------------------------


@pytest.mark.parametrize("method", ["PUT", "PATCH", "OPTIONS"])
async def test_other_methods_are_405_with_allow(http: httpx.AsyncClient, url: str, method: str) -> None:
    response = await http.request(method, url, headers={"Origin": "http://browser.example"})
    assert (response.status_code, response.content) == (405, b"")
    assert response.headers["allow"] == "POST,GET,HEAD,DELETE"  # the reference's exact value
    assert "content-type" not in response.headers
    assert not [name for name in response.headers if name.startswith("access-control-")]


async def test_options_preflight_is_405_when_cors_is_off(http: httpx.AsyncClient, url: str) -> None:
    headers = {
        "Origin": "http://browser.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,acp-connection-id",
    }
    response = await http.options(url, headers=headers)
    assert response.status_code == 405
    assert not [name for name in response.headers if name.startswith("access-control-")]


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
async def test_trailing_slash_is_not_redirected(http: httpx.AsyncClient, url: str, method: str) -> None:
    response = await http.request(
        method, url + "/", headers={**JSON, "Accept": "text/event-stream"}, content=json.dumps(INIT)
    )
    assert response.status_code not in (301, 302, 307, 308)
    assert "location" not in response.headers
    assert response.status_code == 404


async def test_health_route(http: httpx.AsyncClient, wire_server: DaphneServer) -> None:
    response = await http.get(f"http://127.0.0.1:{wire_server.port}/health")
    assert (response.status_code, response.text) == (200, "ok")
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
